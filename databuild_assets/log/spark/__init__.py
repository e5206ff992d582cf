"""The Delta backend through Spark (`backend.py`): any Hadoop filesystem, and time travel over the
lake's versions (`time_travel.py`)."""
