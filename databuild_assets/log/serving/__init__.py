"""The JVM-free serving path of a Delta lake: what a live DataBuild service opens.

follower.py   follow a Delta table commit by commit (one `stat` says whether it moved)
append.py     a small append as one Delta commit, without a query engine
index.py      the serving index: the SQLite reference schema, on disk, stamped with the
              Delta versions it reflects
backend.py    `DeltaRsEventLog`: opens the index, applies only the commits after its stamp
"""
