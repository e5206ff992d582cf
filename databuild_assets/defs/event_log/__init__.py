"""The raw event log domain: ingestion of landing files into raw_event_log and event_quarantine."""
