"""The Dagster UI as a person sees it: `dagster dev` (webserver and daemon) on loopback with this
repo's workspace.yaml and dagster.yaml, driven in headless Chromium.

It checks that the asset graph shows every asset and each one's kind icons, that an asset's page
shows its columns, kinds, owner and table before its first run, that a materialization launched
from the UI completes and its metadata is shown, that the schedules and sensors are listed, and
that the erase job's launchpad accepts a tombstone request (and flags a wrong one). Screenshots go to
`.ui-screenshots/`. Run it with `make ui-test` (it installs Debian's chromium when missing).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from databuild_assets_tests.ui_support import REPO_ROOT, UI_TEST_COMMAND, DagsterDev, chromium_executable

pytestmark = pytest.mark.ui

SCREENSHOTS = Path(os.environ.get("DATABUILD_UI_SCREENSHOTS", REPO_ROOT / ".ui-screenshots"))
LOCATION = "databuild_assets.definitions"  # the code location's name, from workspace.yaml's module
# Generous: a run starts a JVM, and the machine is shared (2 cores).
RUN_TIMEOUT_S = 600
UI_TIMEOUT_MS = 60_000

# A real tombstone request, as the README tells an operator to type it.
TOMBSTONE_REQUEST = {
    "key": "partition_ref",
    "value": "data/users/id=42",
    "actor": "alice@example.com",
    "reason": "ticket 1234",
}


def _skip_reason() -> str | None:
    if os.environ.get("DATABUILD_UI_TEST") != "1":
        return (
            f"the UI test (dagster dev + headless Chromium, several minutes) runs only with "
            f"DATABUILD_UI_TEST=1: run `{UI_TEST_COMMAND}`"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"the Python package playwright is not installed: run `{UI_TEST_COMMAND}`"
    if chromium_executable() is None:
        return f"no system Chromium (/usr/bin/chromium): run `{UI_TEST_COMMAND}` (it apt-get installs chromium)"
    return None


if (_reason := _skip_reason()) is not None:
    pytest.skip(_reason, allow_module_level=True)

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError  # noqa: E402

from databuild_assets.definitions import defs  # noqa: E402
from databuild_assets.defs.catalog import TABLE_ASSETS  # noqa: E402
from databuild_assets.projections import PROJECTIONS  # noqa: E402
from databuild_assets.workload import write_landing_files  # noqa: E402


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    """A temporary home and lake, with a tiny landing workload (a few bad and redelivered lines)."""
    workdir = tmp_path_factory.mktemp("ui")
    server = DagsterDev(workdir)
    summary = write_landing_files(
        server.lake_root / "landing", 300, seed=11, events_per_file=300, bad_line_rate=0.02, duplicate_rate=0.02
    )
    return server, summary


@pytest.fixture(scope="module")
def dagster_dev(landed):
    server, _ = landed
    started = time.monotonic()
    server.start()
    try:
        server.wait_until_ready()
        print(f"dagster dev ready on {server.url} in {time.monotonic() - started:.0f} s (log: {server.log_path})")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        # Debian's chromium; Playwright downloads nothing.
        chromium = playwright.chromium.launch(executable_path=chromium_executable(), headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, dagster_dev, request):
    context = browser.new_context(viewport={"width": 1600, "height": 1000}, base_url=dagster_dev.url)
    context.set_default_timeout(UI_TIMEOUT_MS)
    page = context.new_page()
    # A fresh DAGSTER_HOME greets its first visitor with a newsletter dialog, a moment after the
    # page loads; "Skip" is remembered in DAGSTER_HOME. Dismiss it first, then whenever it shows.
    community = page.get_by_role("dialog").filter(has_text="Join the Dagster community")
    if not dagster_dev.greeted:
        page.goto("/")
        try:
            community.wait_for(state="visible", timeout=20_000)
            community.get_by_role("button", name="Skip").click()
        except PlaywrightTimeoutError:
            pass  # not shown (an older or newer Dagster): nothing to dismiss
        dagster_dev.greeted = True
    page.add_locator_handler(community, lambda: community.get_by_role("button", name="Skip").click())
    yield page
    # What the page showed last, pass or fail: the first thing to look at when a check fails.
    screenshot(page, f"last-{request.node.name}")
    context.close()


def screenshot(page: Page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def expected_asset_names() -> list[str]:
    names = sorted(key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys())
    # The definitions themselves are checked elsewhere; this guards the test from checking nothing.
    assert {
        "raw_event_log",
        "event_quarantine",
        "tombstones",
        "filtered_event_log",
        "partition_state",
        "job_runs",
        "build_requests",
    } <= set(names)
    return names


def number(value: int) -> re.Pattern:
    """A count as the UI may print it: 1234 or 1,234, nothing else around it."""
    return re.compile(rf"^\s*({value}|{value:,})\s*$")


def row_count(page: Page):
    """dagster/row_count, which the asset page shows in its Status section as "Row count"."""
    return page.get_by_text("Row count", exact=True).locator("..")


def row_count_text(value: int) -> re.Pattern:
    return re.compile(rf"^\s*Row count\s*({value}|{value:,})\s*$")


def metadata_row(page: Page, key: str):
    """The row of the asset page's metadata table with this key."""
    return page.locator("tr").filter(has=page.get_by_text(key, exact=True)).first


def test_the_asset_graph_shows_every_asset(page: Page):
    page.goto("/asset-groups")
    expect(page.get_by_text("Global asset lineage")).to_be_visible()
    materializable = len(defs.resolve_asset_graph().materializable_asset_keys)  # all but landing_files
    expect(page.get_by_role("button", name=f"Materialize all ({materializable})")).to_be_visible()
    # Groups start collapsed: expand them all from the graph's settings menu (the gear, not the
    # navigation's "Settings").
    page.get_by_role("button", name="settings", exact=True).click()
    expand = page.get_by_role("menuitem", name="Expand all groups")
    collapse = page.get_by_role("menuitem", name="Collapse all groups")
    expect(expand.or_(collapse)).to_be_visible()
    if expand.count():  # the choice is remembered in the browser; a fresh context starts collapsed
        expand.click()
    page.keyboard.press("Escape")
    for name in expected_asset_names():
        expect(page.get_by_text(name, exact=True).first, f"asset {name} in the graph").to_be_visible()
    for group in ("event_log", "maintenance", "projections"):
        expect(page.get_by_text(group, exact=True).first).to_be_visible()
    screenshot(page, "1-asset-graph")


def kind_icon(page: Page, kind: str):
    """A kind's icon as the UI draws it: role img, labelled with the kind."""
    return page.get_by_role("img", name=kind, exact=True)


def test_the_asset_graph_shows_each_assets_kind_icons_and_the_catalog_filters_on_them(page: Page):
    graph = defs.resolve_asset_graph()
    for group in ("event_log", "projections"):
        page.goto(f"/locations/{LOCATION}/asset-groups/{group}")
        names = [k.to_user_string() for k in graph.get_all_asset_keys() if graph.get(k).group_name == group]
        for name in names:
            expect(page.get_by_text(name, exact=True).first, f"asset {name} in the graph").to_be_visible()
        tables = [name for name in names if name in TABLE_ASSETS]
        # One Spark and one Delta Lake icon under each table's node.
        expect(kind_icon(page, "spark")).to_have_count(len(tables))
        expect(kind_icon(page, "deltalake")).to_have_count(len(tables))
        if group == "event_log":
            expect(kind_icon(page, "json")).to_have_count(1)  # landing_files
        screenshot(page, f"1-graph-kinds-{group}")

    # Kinds are a filter of the catalog: the Delta tables are every asset but the landing files.
    page.goto("/assets?asset-selection=kind%3Adeltalake")
    for name in TABLE_ASSETS:
        expect(page.locator(f'a[href="/assets/{name}"]')).to_be_visible()
    expect(page.locator('a[href="/assets/landing_files"]')).to_have_count(0)
    screenshot(page, "1-catalog-kind-deltalake")


def test_an_assets_page_shows_its_columns_kinds_owner_and_table_before_its_first_run(page: Page, dagster_dev):
    page.goto("/assets/partition_state")
    expect(page.get_by_text("Never materialized").first).to_be_visible()
    expect(page.get_by_text("Columns", exact=True).first).to_be_visible()
    for field in PROJECTIONS["partition_state"].schema.fields:
        row = page.locator("tr").filter(has=page.get_by_text(field.name, exact=True)).first
        expect(row, f"column {field.name}").to_contain_text(field.dataType.simpleString())
        expect(row, f"column {field.name}").to_contain_text(field.metadata["comment"])
        if not field.nullable:
            expect(row).to_contain_text("non-nullable")
    expect(page.locator("tr").filter(has=page.get_by_text("partition_ref", exact=True)).first).to_contain_text("unique")
    expect(kind_icon(page, "spark").first).to_be_visible()
    expect(kind_icon(page, "deltalake").first).to_be_visible()
    expect(page.get_by_text("databuild", exact=True).first).to_be_visible()  # owner team:databuild
    table_uri = (dagster_dev.lake_root / "tables" / "partition_state").as_uri()
    expect(page.get_by_text(table_uri, exact=True)).to_be_visible()
    screenshot(page, "1-partition-state-columns")
    # Then the internal fold state a refresh keeps beside each row, as the table has it.
    fold_state = page.locator("tr").filter(has=page.get_by_text("_fold_state", exact=True)).first
    fold_state.scroll_into_view_if_needed()
    expect(fold_state).to_contain_text("struct")
    expect(fold_state).to_contain_text("Internal: the mergeable aggregates")
    page.screenshot(path=str(SCREENSHOTS / "1-partition-state-internal-columns.png"))


def test_the_schedules_and_sensors_are_listed(page: Page):
    page.goto("/automation")
    schedules = [s.name for s in defs.schedules]
    sensors = [s.name for s in defs.sensors]
    assert {"compaction_schedule", "vacuum_schedule"} <= set(schedules)
    assert {"landing_files_sensor", "event_log_commits_sensor"} <= set(sensors)
    for name in schedules + sensors:
        expect(page.get_by_text(name, exact=True), f"{name} on the Automation page").to_be_visible()
    # The cron expressions as the UI words them (the defaults: daily 03:00, Sundays 04:00 UTC).
    if "DATABUILD_COMPACTION_CRON" not in os.environ:
        expect(page.get_by_text("Scheduled At 03:00 AM UTC", exact=True)).to_be_visible()
    if "DATABUILD_VACUUM_CRON" not in os.environ:
        expect(page.get_by_text("Scheduled At 04:00 AM UTC, only on Sunday", exact=True)).to_be_visible()
    screenshot(page, "2-automation")


def test_the_erase_jobs_launchpad_accepts_a_tombstone_request(page: Page):
    page.goto(f"/locations/{LOCATION}/jobs/erase_job/playground")
    editor = page.locator(".CodeMirror")
    expect(editor).to_be_visible()

    def type_config(yaml: str) -> None:
        editor.click()
        page.keyboard.press("Control+A")
        # insert_text, not type: the editor would auto-indent typed newlines.
        page.keyboard.insert_text(yaml)

    # A misspelt field is refused: the check below can tell a bad request from a good one.
    type_config("ops:\n  tombstones:\n    config:\n      key: partition_ref\n      valu: data/users/id=42\n")
    expect(page.get_by_text(re.compile(r'unexpected config entry "valu"'))).to_be_visible()
    screenshot(page, "3-erase-launchpad-refused")

    type_config(
        "ops:\n  tombstones:\n    config:\n" + "".join(f"      {k}: {v}\n" for k, v in TOMBSTONE_REQUEST.items())
    )
    expect(page.get_by_text("No errors", exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile("unexpected config entry"))).to_have_count(0)
    expect(page.get_by_role("button", name="Launch Run")).to_be_enabled()
    for value in TOMBSTONE_REQUEST.values():
        expect(editor).to_contain_text(value)
    screenshot(page, "4-erase-launchpad-accepted")


def test_a_materialization_launched_from_the_ui_completes_and_shows_its_metadata(page: Page, dagster_dev, landed):
    _, summary = landed
    page.goto("/assets/raw_event_log")
    expect(page.get_by_text("Never materialized").first).to_be_visible()
    page.get_by_role("button", name="Materialize").click()
    # raw_event_log and event_quarantine are one multi-asset: the UI asks to take both.
    dialog = page.get_by_role("dialog").filter(has_text="Additional assets will be materialized")
    expect(dialog).to_contain_text("event_quarantine")
    dialog.get_by_role("button", name="Confirm").click()
    launched = page.get_by_text(re.compile(r"Launched run [0-9a-f]{8}"))
    expect(launched).to_be_visible()
    screenshot(page, "5-materialization-launched")
    view = page.get_by_role("link", name="View", exact=True)
    run_id = view.get_attribute("href").rstrip("/").rsplit("/", 1)[-1]

    started = time.monotonic()
    status = dagster_dev.wait_for_run(run_id, timeout=RUN_TIMEOUT_S)
    print(f"run {run_id}: {status} in {time.monotonic() - started:.0f} s after launch")
    page.goto(f"/runs/{run_id}")
    expect(page.get_by_text("Success", exact=True).first).to_be_visible()
    expect(page.get_by_text("2 assets", exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile("Finished execution of run")).first).to_be_visible()
    screenshot(page, "6-run")
    assert status == "SUCCESS", dagster_dev.log_tail()

    # The counts on the asset page reconcile with what was landed.
    page.goto("/assets/raw_event_log")
    expect(page.get_by_text("Latest materialization")).to_be_visible()
    expected = {
        "files_ingested": len(summary.files),
        "lines_read": summary.lines_written,
        "accepted": summary.events_written,
        "duplicates_skipped": summary.duplicate_lines_written,
        "quarantined": summary.bad_lines_written,
    }
    assert summary.duplicate_lines_written and summary.bad_lines_written, "the workload should hold both kinds of noise"
    for key, value in expected.items():
        expect(metadata_row(page, key).locator("td").last, f"metadata {key}").to_have_text(number(value))
    expect(metadata_row(page, "path")).to_contain_text(str(dagster_dev.lake_root / "tables" / "raw_event_log"))
    # The preview shows what the newest events are and where they came from, never their ids: Dagster
    # keeps every preview in its run storage, out of an erasure's reach (defs/metadata.py).
    expect(metadata_row(page, "preview")).to_contain_text("event_type")
    expect(metadata_row(page, "preview")).not_to_contain_text("event_id")
    expect(row_count(page)).to_have_text(row_count_text(summary.events_written))
    screenshot(page, "7-raw-event-log-metadata")

    page.goto("/assets/event_quarantine")
    expect(metadata_row(page, "quarantined").locator("td").last).to_have_text(number(summary.bad_lines_written))
    expect(row_count(page)).to_have_text(row_count_text(summary.bad_lines_written))
    screenshot(page, "8-event-quarantine-metadata")
