"""What the server tells of itself: :class:`ModelInfo` (filled in once the model is loaded) and the body
of ``GET /info``: the model (its name, its files' SHA-256), its vectors' size and layers, how it runs
(precision, backend, device, state mode), the server's limits, elmo-fast's version and the model's
licence terms (:func:`licence_terms`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__
from ..file_hash import hash_file
from .batcher import Limits
from .protocol import RequestLimits


@dataclass
class ModelInfo:
    """What the answers say of the model: its name, then (once loaded, :meth:`measure`) the size of its
    vectors, its layers, how it runs and the files it was read from."""

    name: str
    dim: int = 0
    layers: int = 0
    precision: str = ""
    backend: str = ""
    device: str = ""
    state_mode: str = "stateless"
    files: dict[str, str] = field(default_factory=dict)
    _digests: dict[str, str] | None = None

    def measure(self, embedder: object, dim: int) -> None:
        """Read what an embedder (ElmoEmbedder, or anything with ``embed_batch``) says of itself."""
        self.dim = dim
        bilm = getattr(embedder, "elmo_bilm", None)
        self.layers = int(getattr(embedder, "num_layers", 0) or 0)
        if bilm is not None:
            self.precision = str(getattr(bilm.precision, "name", bilm.precision))
            self.backend = str(bilm.backend)
            self.state_mode = "stateful" if bilm.stateful else "stateless"
        self.device = str(getattr(embedder, "device", ""))
        self.files = {role: str(path) for role, path in getattr(embedder, "model_files", {}).items()}

    def digests(self) -> dict[str, str]:
        """``{file name: SHA-256}`` of the model's files (read once, on first asking: a large model's
        weights take a second)."""
        if self._digests is None:
            self._digests = {os.path.basename(p): hash_file(p)[1] for p in self.files.values() if os.path.isfile(p)}
        return self._digests


def licence_terms(files: dict[str, str]) -> str | None:
    """The licence terms of the model read from ``files``, when elmo-fast knows them: the bundled
    model's (its MODEL_INFO.json where the install has one, else its model card's licence row); None
    for any other model."""
    from ..pretrained import bundled

    names = {bundled.bundled_name(Path(p).parent) for p in files.values()} if files else {None}
    if len(names) != 1 or None in names:
        return None
    (name,) = names
    try:
        return bundled.model_info(name=name).license
    except ValueError:
        pass
    card = bundled.BUNDLED[name] / "MODEL_CARD.md"
    try:
        text = card.read_text(encoding="utf-8")
    except OSError:
        return None
    row = re.search(r"^\|\s*licen[cs]e[^|]*\|\s*(.+?)\s*\|\s*$", text, re.M | re.I)
    return row.group(1) if row else None


def info_body(info: ModelInfo, limits: Limits, request_limits: RequestLimits) -> dict:
    """The body of ``GET /info`` (its fields: the OpenAPI description's ``Info``)."""
    return {
        "model_id": info.name,
        "model_files": info.digests(),
        "dim": info.dim,
        "layers": info.layers,
        "precision": info.precision,
        "backend": info.backend,
        "device": info.device,
        "state_mode": info.state_mode,
        "max_batch_size": limits.max_batch_size,
        "max_batch_tokens": limits.max_batch_tokens,
        "max_request_tokens": request_limits.max_request_tokens,
        "max_client_batch_size": request_limits.max_client_batch_size,
        "payload_limit": request_limits.payload_bytes,
        "auto_truncate": request_limits.auto_truncate,
        "version": __version__,
        "license": licence_terms(info.files),
    }
