"""DataBuild's Build Event Log as a Delta Lake lakehouse on Spark, with Dagster assets."""
