"""`appliance models` (list the local models with their fit, the served one marked; --json) and `appliance models
add PATH [--link]`. "Served" is the model APPLIANCE_MODEL names: the one a start of the server serves."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.models.catalogue import LocalModels, NotAModel, add
from appliance.settings import Settings
from web.console.render import fmt_bytes

# The settings a listing reads: where the models are, and what decides the fit.
SETTING_FLAGS = (
    "data_dir",
    "model",
    "quantization",
    "dtype",
    "device",
    "kv_cache_bytes",
    "max_model_len",
    "gpu_memory_utilization",
    "gpu_memory_cap_bytes",
)


def add_parsers(commands: Any, add_setting_flags: Callable[[argparse.ArgumentParser, tuple[str, ...]], None]) -> None:
    models = commands.add_parser("models", help="the local models, their size and what fits on this machine")
    add_setting_flags(models, SETTING_FLAGS)
    models.add_argument("--json", action="store_true", help="print JSON")
    actions = models.add_subparsers(dest="models_command", metavar="{add}")
    adding = actions.add_parser("add", help="copy (or --link) a HF directory or a .gguf into the models folder")
    adding.add_argument("path", type=Path, help="a Hugging Face model directory (config.json + weights) or a .gguf")
    adding.add_argument("--link", action="store_true", help="symlink it instead of copying")


def run(settings: Settings, args: argparse.Namespace) -> int:
    if args.models_command == "add":
        try:
            target = add(settings, args.path, args.link)
        except NotAModel as exc:
            print(f"appliance: {exc}", file=sys.stderr)
            return 1
        print(f"{'linked' if args.link else 'copied'} {args.path} to {target}; serve it with APPLIANCE_MODEL={target}")
        return 0
    entries = LocalModels(settings).models(settings.model, served_kv_bytes=None)
    if args.json:
        print(json.dumps([dataclasses.asdict(e) | {"fit_summary": e.fit.summary if e.fit else None} for e in entries]))
        return 0
    print(f"models folder: {settings.model_cache_dir}")
    for e in entries:
        params = f"{e.params / 1e6:,.1f} M parameters" if e.params else "parameters unknown"
        mark = "*" if e.served else " "
        served = "  (served: APPLIANCE_MODEL)" if e.served else ""
        print(f"{mark} {e.name}  {e.kind}, {fmt_bytes(e.disk_bytes)} on disk, {params}{served}")
        print(f"    {e.fit.summary if e.fit else f'cannot be sized: {e.problem}'}")
    return 0
