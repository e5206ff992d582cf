"""The docs say what the code does: every relative link in README.md, docs/ and bench/README.md
leads to a file (and heading) that exists, every decision record is indexed and well formed, the
run config, jobs, schedules, sensors and checks the docs name exist in the Dagster definitions,
and every command line they show parses. No Spark: definitions load without a JVM."""

from __future__ import annotations

import importlib
import json
import re
import sys
from functools import cache
from pathlib import Path

import dagster
import pytest
import yaml
from dagster import DagsterInvalidConfigError, validate_run_config

from databuild_assets import cli
from databuild_assets.projections import PROJECTIONS
from databuild_assets_tests.support import REPO_ROOT

DOCS = sorted([REPO_ROOT / "README.md", REPO_ROOT / "bench" / "README.md", *(REPO_ROOT / "docs").rglob("*.md")])
DECISIONS = REPO_ROOT / "docs" / "decisions"
RECORDS = sorted(DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
RECORD_SECTIONS = ("## Context", "## Decision", "## Alternatives", "## Consequences")

FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`]+)`")
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def _name(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def prose(path: Path) -> str:
    """The file's text without its fenced code blocks (sample output, not links or commands to check)."""
    return FENCE.sub("", path.read_text())


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    result = set()
    for line in prose(path).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return frozenset(result)


def relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path)) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with anchor #{anchor} in {_name(linked)}")
    assert not broken, f"{_name(doc)} has broken links:\n" + "\n".join(broken)


def test_nothing_links_to_the_old_single_decisions_file() -> None:
    mentions = [
        f"{_name(path)}:{number}"
        for path in [*DOCS, *REPO_ROOT.glob("databuild_assets*/**/*.py"), REPO_ROOT / "pyproject.toml"]
        if path != Path(__file__)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "decisions.md" in line
    ]
    assert not mentions, "docs/decisions.md is now docs/decisions/<record>.md; still named at " + ", ".join(mentions)


def test_every_decision_record_is_indexed_and_has_its_sections() -> None:
    index = (DECISIONS / "README.md").read_text()
    for record in RECORDS:
        text = record.read_text()
        title = text.splitlines()[0].removeprefix("# ")
        assert f"[{title}]({record.name})" in index, f"{record.name} is not listed in docs/decisions/README.md"
        assert text.startswith(f"# {record.name[:4]}. "), f"{record.name}: its title must start with its number"
        assert re.search(r"^\*\*Status\*\*: (accepted|superseded by \[\d{4}\]\(\d{4}-[^)]+\.md\))", text, re.M), (
            f"{record.name}: a Status line says accepted, or superseded by NNNN with a link"
        )
        missing = [section for section in RECORD_SECTIONS if section not in text]
        assert not missing, f"{record.name} lacks {missing}"


def test_a_superseded_record_is_marked_so_in_the_index_and_its_successor_names_it() -> None:
    index = (DECISIONS / "README.md").read_text()
    for record in RECORDS:
        match = re.search(r"^\*\*Status\*\*: superseded by \[(\d{4})\]\((\d{4}-[^)]+\.md)\)", record.read_text(), re.M)
        if match is None:
            continue
        successor = DECISIONS / match.group(2)
        assert f"Supersedes [{record.name[:4]}]({record.name})" in successor.read_text()
        row = next(line for line in index.splitlines() if f"]({record.name})" in line)
        assert f"superseded by [{match.group(1)}]({match.group(2)})" in row


# --- The Dagster names and run config the docs show -------------------------------------------


@cache
def repository():
    from databuild_assets.definitions import defs

    return defs.get_repository_def()


def jobs():
    return [job for job in repository().get_all_jobs() if not job.name.startswith("__")]


def ops_of(job) -> dict[str, list[str]]:
    """The job's op names, each with its config fields."""
    result = {}
    for node in job.graph.node_defs:
        config_type = node.config_schema.config_type if node.config_schema else None
        result[node.name] = list(getattr(config_type, "fields", {}) or {})
    return result


def docs_text() -> str:
    return "\n".join(prose(path) for path in DOCS)


def inline_code() -> list[str]:
    return INLINE_CODE.findall(docs_text())


def test_the_jobs_schedules_and_sensors_the_docs_name_exist() -> None:
    repo = repository()
    known = {job.name for job in jobs()} | {s.name for s in repo.schedule_defs} | {s.name for s in repo.sensor_defs}
    named = {code for code in inline_code() if re.fullmatch(r"[a-z_]+_(job|schedule|sensor)", code)}
    assert named - known == set(), f"the docs name what the definitions do not have: {sorted(named - known)}"
    assert known - named == set(), f"the docs never mention: {sorted(known - named)}"


def test_the_asset_checks_and_check_ops_the_docs_name_exist() -> None:
    check_names = {key.name for key in repository().asset_graph.asset_check_keys}
    op_names = {name for job in jobs() for name in ops_of(job)}
    operations = prose(REPO_ROOT / "docs" / "operations.md")
    section = operations.split("## Asset checks", 1)[1].split("\n## ", 1)[0]
    table_checks = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    named_ops = {code for code in inline_code() if re.fullmatch(r"[a-z_]+_checks", code) and not hasattr(dagster, code)}
    assert table_checks <= check_names, f"operations.md lists checks that do not exist: {table_checks - check_names}"
    assert named_ops <= op_names, f"the docs name check ops that do not exist: {named_ops - op_names}"
    assert check_names <= set(inline_code()), f"checks the docs never name: {check_names - set(inline_code())}"


def test_the_number_of_checks_per_projection_the_docs_state_is_the_number_erase_job_runs() -> None:
    erase = repository().get_job("erase_job")
    checks = erase.asset_layer.asset_graph.asset_check_keys
    projections = {key.asset_key for key in checks if key.asset_key.to_user_string() in PROJECTIONS}
    per_projection = {len([key for key in checks if key.asset_key == asset]) for asset in projections}
    stated = re.findall(r"(\w+) checks on each projection", docs_text(), re.I)
    assert stated, "operations.md says how many checks each projection has"
    assert {NUMBERS[word.lower()] for word in stated} == per_projection


def test_every_run_config_path_the_docs_show_names_an_op_of_a_job() -> None:
    op_names = {name for job in jobs() for name in ops_of(job)}
    shown = set(re.findall(r"ops\.(\w+)\.config", docs_text())) | set(re.findall(r'\{"ops": \{"(\w+)"', docs_text()))
    assert shown, "the docs show run config"
    assert shown <= op_names, f"run config under ops the jobs do not have: {sorted(shown - op_names)}"


def test_the_run_configuration_table_names_each_ops_config_fields() -> None:
    operations = prose(REPO_ROOT / "docs" / "operations.md")
    table = operations.split("### Run configuration", 1)[1].split("\n### ", 1)[0]
    fields_of = {name: fields for job in jobs() for name, fields in ops_of(job).items()}
    op = None
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    assert rows
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if path := re.fullmatch(r"`ops\.(\w+)\.config`", cells[1]):
            op = path.group(1)
        for field in INLINE_CODE.findall(cells[2]):
            assert field in fields_of[op], f"ops.{op}.config has no field {field}: {fields_of[op]}"


def run_config_snippets() -> list[dict]:
    """The run configs the docs show: inline JSON (`{"ops": ...}`) and YAML blocks starting `ops:`."""
    inline = [json.loads(code) for code in inline_code() if code.startswith('{"ops"')]
    blocks = [
        yaml.safe_load(block)
        for path in DOCS
        for block in re.findall(r"^```yaml\n(ops:.*?)^```", path.read_text(), re.M | re.S)
    ]
    return inline + blocks


def test_every_run_config_snippet_the_docs_show_is_accepted_by_the_jobs_that_have_those_ops() -> None:
    snippets = run_config_snippets()
    assert len(snippets) >= 4
    for snippet in snippets:
        accepting = [job for job in jobs() if set(snippet["ops"]) <= set(ops_of(job))]
        assert accepting, f"no job has the ops of {snippet}"
        for job in accepting:
            try:
                validate_run_config(job, snippet)
            except DagsterInvalidConfigError as error:
                pytest.fail(f"{job.name} refuses {snippet}: {error}")


# --- The command lines the docs show ---------------------------------------------------------------


def command_lines() -> list[str]:
    """Every line of the docs (code blocks included) that runs databuild-assets or a bench module."""
    return [
        line
        for path in DOCS
        for line in path.read_text().splitlines()
        if re.search(r"databuild-assets [a-z]|-m databuild_assets\.cli |-m bench\.\w", line)
    ]


def help_of(main, argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """What `main` prints for `argv`, which must end in --help (argparse exits 0 before doing anything)."""
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    with pytest.raises(SystemExit) as exit_:
        main(argv) if main.__code__.co_argcount else main()
    assert exit_.value.code == 0, f"{argv} exited {exit_.value.code}"
    return capsys.readouterr().out


def options_after(command: str, line: str) -> set[str]:
    after = line.split(command, 1)[1]
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", after.split("#", 1)[0]))


def test_every_databuild_assets_subcommand_the_docs_show_parses_with_the_options_shown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: dict[str, set[str]] = {}
    for line in command_lines():
        for command in re.findall(r"(?:databuild-assets|-m databuild_assets\.cli) ([a-z][a-z-]*)", line):
            shown.setdefault(command, set()).update(options_after(command, line))
    assert {"demo", "query", "migrate", "spark-driver"} <= set(shown)
    for command, options in shown.items():
        text = help_of(cli.main, [command, "--help"], capsys, monkeypatch)
        missing = {option for option in options if option not in text}
        assert not missing, f"databuild-assets {command} has no {sorted(missing)}"


def test_every_bench_module_the_docs_show_parses_with_the_options_shown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: dict[str, set[str]] = {}
    for line in command_lines():
        for module in re.findall(r"-m (bench\.\w+)", line):
            shown.setdefault(module, set()).update(options_after(module, line))
    assert shown
    for module, options in shown.items():
        text = help_of(importlib.import_module(module).main, ["--help"], capsys, monkeypatch)
        missing = {option for option in options if option not in text}
        assert not missing, f"python -m {module} has no {sorted(missing)}"


def test_every_make_target_the_docs_name_is_in_the_makefile() -> None:
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO_ROOT / "Makefile").read_text(), re.M))
    named = {name for path in DOCS for name in re.findall(r"(?:`|^)make ([a-z][a-z0-9-]*)", path.read_text(), re.M)}
    assert named, "the docs name make targets"
    assert named <= targets, f"make targets the Makefile lacks: {sorted(named - targets)}"


def test_every_setting_the_docs_name_is_read_somewhere() -> None:
    sources = (
        "\n".join(
            path.read_text()
            for pattern in ("databuild_assets/**/*.py", "databuild_assets_tests/*.py", "bench/*.py")
            for path in REPO_ROOT.glob(pattern)
        )
        + (REPO_ROOT / "Makefile").read_text()
    )
    named = set(re.findall(r"\bDATABUILD_[A-Z_]*[A-Z]\b", docs_text()))
    assert named
    unread = sorted(name for name in named if name not in sources)
    assert not unread, f"the docs name settings no code reads: {unread}"
