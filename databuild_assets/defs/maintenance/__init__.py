"""The maintenance domain: tombstones and the filtered log, the erase job, compaction and vacuum on schedules."""
