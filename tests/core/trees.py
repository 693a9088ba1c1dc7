"""ElasticQuotaTrees for the core tests: one (or its document) from a root written
inline, and the walkthrough's (examples/elasticquotatree.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fleetq.models import ElasticQuotaTree, parse_tree

WALKTHROUGH = Path(__file__).resolve().parents[2] / "examples" / "elasticquotatree.yaml"


def tree_doc(root: dict[str, Any], name: str = "tree", **annotations: str) -> dict[str, Any]:
    """The document of the tree ``name`` in kube-system with ``root`` and the tree's
    ``annotations``."""
    return {
        "apiVersion": "scheduling.sigs.k8s.io/v1beta1",
        "kind": "ElasticQuotaTree",
        "metadata": {"name": name, "namespace": "kube-system", "annotations": annotations},
        "spec": {"root": root},
    }


def make_tree(root: dict[str, Any], name: str = "tree", **annotations: str) -> ElasticQuotaTree:
    """The tree ``name`` in kube-system with ``root`` and the tree's ``annotations``."""
    return parse_tree(tree_doc(root, name, **annotations))


def walkthrough() -> ElasticQuotaTree:
    return parse_tree(yaml.safe_load(WALKTHROUGH.read_text()))
