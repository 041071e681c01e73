"""The golden injection cases under tests/golden/, loaded once for every tier that replays them.

Each case is a directory: `input.yaml` (the objects to inject), `sidecarsets.yaml`, optional
`namespace.yaml` (Namespace objects giving namespace labels), optional `args` (extra CLI flags,
one per line), `expected.yaml` (the CLI's stdout) and, when there are any, `expected.warnings`
(the CLI's stderr). The CLI tier, the engine tier and the webhook tier all read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kuberuntime.jsontypes import JsonObj

GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDEN_NOW = "2024-01-01T00:00:00Z"


@dataclass(frozen=True)
class GoldenCase:
    name: str
    dir: Path
    input_docs: list[Any]
    sidecarsets: list[JsonObj]
    namespace_labels: dict[str, dict[str, str]]
    expected_docs: list[Any]
    expected_warnings: list[str]
    args: tuple[str, ...]

    @property
    def input_path(self) -> Path:
        return self.dir / "input.yaml"

    @property
    def sidecarsets_path(self) -> Path:
        return self.dir / "sidecarsets.yaml"

    @property
    def namespace_path(self) -> Path | None:
        path = self.dir / "namespace.yaml"
        return path if path.exists() else None

    def cli_argv(self) -> list[str]:
        """`sidecarctl` arguments that reproduce expected.yaml."""
        argv = ["inject", "-f", str(self.input_path), "--sidecarset", str(self.sidecarsets_path)]
        if self.namespace_path is not None:
            argv += ["--namespace-labels", str(self.namespace_path)]
        return [*argv, "--timestamp", GOLDEN_NOW, *self.args]

    @property
    def has_pods(self) -> bool:
        return any(isinstance(doc, dict) and doc.get("kind") == "Pod" for doc in self.input_docs)

    def pods(self) -> list[tuple[JsonObj, Any]]:
        """Top-level Pod inputs paired with their expected output document."""
        return [
            (doc, expected)
            for doc, expected in zip(self.input_docs, self.expected_docs, strict=False)
            if isinstance(doc, dict) and doc.get("kind") == "Pod"
        ]


def _docs(path: Path) -> list[Any]:
    if not path.exists():
        return []
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _flatten(docs: list[Any]) -> list[JsonObj]:
    out: list[JsonObj] = []
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "List":
            out += doc.get("items") or []
        elif isinstance(doc, dict):
            out.append(doc)
    return out


def load(case_dir: Path) -> GoldenCase:
    namespaces = _flatten(_docs(case_dir / "namespace.yaml"))
    warnings_path = case_dir / "expected.warnings"
    args_path = case_dir / "args"
    return GoldenCase(
        name=case_dir.name,
        dir=case_dir,
        input_docs=_docs(case_dir / "input.yaml"),
        sidecarsets=_flatten(_docs(case_dir / "sidecarsets.yaml")),
        namespace_labels={ns["metadata"]["name"]: dict(ns["metadata"].get("labels") or {}) for ns in namespaces},
        expected_docs=_docs(case_dir / "expected.yaml"),
        expected_warnings=warnings_path.read_text(encoding="utf-8").splitlines() if warnings_path.exists() else [],
        args=tuple(args_path.read_text(encoding="utf-8").split()) if args_path.exists() else (),
    )


def cases() -> list[GoldenCase]:
    """Every golden case, sorted by name."""
    return [load(d) for d in sorted(GOLDEN_DIR.iterdir()) if d.is_dir() and (d / "input.yaml").exists()]
