"""The Grafana dashboard and the alert examples name only metrics and labels the code exports.

Every panel's PromQL (and every alert rule's, in deploy/prometheus/alerts.yml and in
docs/operations.md) is read for ``redsaga_*`` names and the labels its selectors and
``by (...)`` clauses use; each must be a sample some :data:`saga.metrics.METRICS` or
:data:`relay.metrics.RELAY_METRICS` entry exports, and each label one of that metric's (or
one Prometheus adds: ``le`` for buckets, ``instance`` and ``job`` for targets).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bus.metrics import MetricSpec
from relay.metrics import RELAY_METRICS
from saga.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD: dict[str, Any] = json.loads((ROOT / "deploy/grafana/dashboards/redsaga.json").read_text())
ALERTS: dict[str, Any] = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
EXPORTED = (*METRICS, *RELAY_METRICS)
"""What workers and relays export."""
SAMPLES = {sample: spec for spec in EXPORTED for sample in spec.samples}
ADDED = {"instance", "job"}
NAME = re.compile(r"\b(redsaga_[a-z0-9_]+)(\{[^}]*\})?")
SELECTOR_LABEL = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def check(expr: str) -> None:
    names = NAME.findall(expr)
    assert names, f"no redsaga metric in {expr!r}"
    labels: set[str] = set()
    for name, selector in names:
        assert name in SAMPLES, f"{expr!r}: {name} is not exported"
        spec = SAMPLES[name]
        labels |= set(spec.labels) | ADDED | ({"le"} if name.endswith("_bucket") else set())
        for label in SELECTOR_LABEL.findall(selector):
            assert label in labels, f"{expr!r}: {name} has no label {label!r}"
    for group in GROUPING.findall(expr):
        for label in filter(None, (part.strip() for part in group.split(","))):
            assert label in labels, f"{expr!r}: grouping by {label!r}, which none of its metrics has"


def test_every_panel_queries_exported_metrics_through_the_provisioned_source() -> None:
    panels = DASHBOARD["panels"]
    assert len(panels) >= 12
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            check(target["expr"])


def test_the_dashboard_shows_every_exported_metric() -> None:
    used = {name for p in DASHBOARD["panels"] for t in p["targets"] for name, _ in NAME.findall(t["expr"])}
    shown = {SAMPLES[name].name for name in used}
    assert shown == {spec.name for spec in EXPORTED}  # every exported metric has a panel


def test_every_alert_example_queries_exported_metrics_and_the_docs_show_them() -> None:
    rules = [rule for group in ALERTS["groups"] for rule in group["rules"]]
    assert {r["alert"] for r in rules} >= {
        "RedsagaSagasStuck",
        "RedsagaDeadLettersGrowing",
        "RedsagaConsumerLag",
    }
    for rule in rules:
        check(rule["expr"])
    docs = (ROOT / "docs/operations.md").read_text()
    assert (ROOT / "deploy/prometheus/alerts.yml").read_text().split("groups:", 1)[1] in docs


def metrics_table(specs: tuple[MetricSpec, ...]) -> str:
    rows = ["| metric | type | labels | from | what |", "| --- | --- | --- | --- | --- |"]
    for spec in specs:
        labels = ", ".join(f"`{label}`" for label in spec.labels) or "-"
        source = f"{spec.source}, at scrape time" if spec.scraped else "the process"
        rows.append(f"| `{spec.name}` | {spec.kind} | {labels} | {source} | {spec.help} |")
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("specs", [METRICS, RELAY_METRICS], ids=["workers", "relays"])
def test_the_operations_page_lists_every_metric_as_the_code_defines_it(specs: tuple[MetricSpec, ...]) -> None:
    assert metrics_table(specs) in (ROOT / "docs/operations.md").read_text()


def test_the_dashboard_filters_by_context_definition_and_instance() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert sorted(variables) == ["context", "definition", "instance"]
    for variable in variables.values():
        check(variable["definition"])
    for panel in DASHBOARD["panels"]:
        for target in panel["targets"]:
            for name, selector in NAME.findall(target["expr"]):
                wanted = {"instance"} | ({"context", "definition"} & set(SAMPLES[name].labels))
                for label in wanted:
                    assert f'{label}=~"${label}"' in selector, (panel["title"], name, label)
