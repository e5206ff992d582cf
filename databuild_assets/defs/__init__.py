"""Dagster definitions, by domain: a thin layer that wires plain functions to resources and
reports what they did as typed metadata. `databuild_assets.definitions` assembles them."""
