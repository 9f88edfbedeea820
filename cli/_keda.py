"""``saga keda``: the KEDA ScaledObject that scales one App's workers on their streams' lag.

Its triggers are the consumer groups a ``saga worker --app`` process reads
(:func:`redsaga.cli._topology.worker_reads`), one ``redis-streams`` trigger per stream and group,
in lag mode (``XINFO GROUPS``, Redis 7+). A context's partitions are separate streams, so an
App reads one stream per partition; KEDA would scale on the busiest single trigger, so the
triggers are summed by a scaling-modifier formula and the target applies to the total lag
(docs/operations.md, "Autoscaling with KEDA").
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
import yaml

from redsaga.cli._common import Json, emit_json
from redsaga.cli._topology import Read, load_app, worker_reads


def trigger_name(read: Read) -> str:
    """A name for ``read``'s trigger that a scaling-modifier formula can use (``payments_shop_0``)."""
    tag = read.stream.split("{", 1)[1].split("}", 1)[0]
    return re.sub(r"[^a-z0-9]+", "_", f"{read.group}_{tag}".lower()).strip("_")


def scaled_object(
    reads: list[Read],
    *,
    deployment: str,
    lag: int,
    min_replicas: int,
    max_replicas: int,
    address_env: str,
    auth_ref: str | None,
) -> dict[str, Any]:
    """The ScaledObject for ``deployment``: one lag trigger per read, scaled on their sum."""
    triggers = []
    for read in reads:
        trigger: dict[str, Any] = {
            "type": "redis-streams",
            "name": trigger_name(read),
            "metadata": {
                "addressFromEnv": address_env,
                "stream": read.stream,
                "consumerGroup": read.group,
                "lagCount": str(lag),
            },
        }
        if auth_ref:
            trigger["authenticationRef"] = {"name": auth_ref}
        triggers.append(trigger)
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": deployment},
        "spec": {
            "scaleTargetRef": {"name": deployment},
            "minReplicaCount": min_replicas,
            "maxReplicaCount": max_replicas,
            "advanced": {
                "scalingModifiers": {
                    "formula": " + ".join(t["name"] for t in triggers),
                    "target": str(lag),
                    "activationTarget": "0",
                    "metricType": "AverageValue",
                }
            },
            "triggers": triggers,
        },
    }


def keda(
    app_ref: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="REDSAGA_APP",
            help="The App the Deployment's workers run, as module:attribute (env REDSAGA_APP).",
            show_default=False,
        ),
    ] = None,
    deployment: Annotated[
        str | None,
        typer.Option(help="The Deployment to scale (default: the App's name).", show_default=False),
    ] = None,
    lag: Annotated[
        int, typer.Option(min=1, help="Entries waiting to be read (all streams together) per replica.")
    ] = 20,
    min_replicas: Annotated[
        int, typer.Option(min=0, help="Fewest replicas (at least 1 for an App that orchestrates).")
    ] = 1,
    max_replicas: Annotated[int, typer.Option(min=1, help="Most replicas.")] = 10,
    address_env: Annotated[
        str, typer.Option(help="The workers' environment variable holding Redis's host:port.")
    ] = "REDIS_ADDRESS",
    auth_ref: Annotated[
        str | None,
        typer.Option(help="A KEDA TriggerAuthentication for Redis's user and password.", show_default=False),
    ] = None,
    json: Json = False,
) -> None:
    """Print the KEDA ScaledObject that scales an App's workers on the lag of the streams they read.

    One redis-streams trigger per stream and consumer group the App's `saga worker` reads
    (every partition's inbox and local-action stream of each context it orchestrates, every
    partition's command stream of each participant, every subscription), each in lag mode;
    a scaling-modifier formula (KEDA 2.12+) sums them, and --lag is the target per replica.
    An App that orchestrates keeps at least one replica: its workers fire timers and
    schedules, which no stream's lag shows. YAML by default; --json prints the same object.
    """
    app = load_app(app_ref)
    if min_replicas < 1 and app.registry.contexts:
        raise typer.BadParameter(
            f"{app.name} orchestrates {', '.join(sorted(app.registry.contexts))}: its workers fire the "
            "timers and schedules, so at 0 replicas no timeout, retry or sleep would fire",
            param_hint="--min-replicas",
        )
    if max_replicas < min_replicas:
        raise typer.BadParameter("must be at least --min-replicas", param_hint="--max-replicas")
    manifest = scaled_object(
        worker_reads(app),
        deployment=deployment or app.name,
        lag=lag,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        address_env=address_env,
        auth_ref=auth_ref,
    )
    if json:
        emit_json(manifest)
    else:
        typer.echo(yaml.safe_dump(manifest, sort_keys=False, width=1_000), nl=False)
