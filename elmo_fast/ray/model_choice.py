"""The model of a Ray actor, given as ``embed`` takes it: a name (``model=``: the bundled ``default``,
an official model, ``hf:OWNER/REPO[@REVISION][/SUBFOLDER]`` or ``URL#sha256=HEX``, fetched once into
the node's cache: the actors of a node that ask for it at once download it once), a directory (``model_dir=``, bilm-tf's or
ELMoForManyLangs'), bilm-tf's two files (``options_file=`` + ``weight_file=``), or nothing (the
bundled model). The arguments travel to the actors as they are; each actor loads the model itself."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ElmoFastError, Param


@dataclass(frozen=True)
class ModelChoice:
    """Which model, in one of the forms above (checked at once: one form, a known name)."""

    model: str | None = None
    model_dir: str | None = None
    options_file: str | None = None
    weight_file: str | None = None
    model_format: str | None = None

    def __post_init__(self) -> None:
        files = self.options_file is not None or self.weight_file is not None
        given = [self.model is not None, self.model_dir is not None, files]
        if sum(given) > 1:
            raise ElmoFastError(
                "give one of ",
                Param("model"),
                " (a name), ",
                Param("model_dir"),
                " or ",
                Param("options_file"),
                " + ",
                Param("weight_file"),
                " (none: the bundled model)",
            )
        if self.model is not None:
            from ..pretrained import parse_model_spec

            try:
                parse_model_spec(self.model)  # no network: a bad name fails where the job is built
            except ElmoFastError as e:
                raise ElmoFastError(Param("model"), f": {e}") from None
        if self.model_format is not None and self.model_dir is None:
            raise ElmoFastError(
                Param("model_format"),
                " picks the model of a ",
                Param("model_dir"),
                " that holds both kinds; give it with ",
                Param("model_dir"),
            )

    @property
    def name(self) -> str:
        """What answers call the model: its name, its directory's name, or its files' directory's name."""
        if self.model is not None:
            return self.model
        if self.model_dir is not None:
            return os.path.basename(os.path.normpath(os.fspath(self.model_dir)))
        if self.options_file is not None:
            return os.path.basename(os.path.dirname(os.path.abspath(os.fspath(self.options_file)))) or "model"
        from ..pretrained import BUNDLED_NAME

        return BUNDLED_NAME

    def load(self, device: str, backend: str = "auto", precision: str | None = None):
        """The model in an :class:`~elmo_fast.ElmoEmbedder` (stateless) on ``device``; a named model is
        fetched into this node's cache first."""
        from ..embedding.embedder import ElmoEmbedder

        if self.model is not None:
            from ..pretrained import fetch

            model = fetch(self.model, progress=False).constructor_args()
            return ElmoEmbedder(**model, device=device, backend=backend, precision=precision)
        return ElmoEmbedder(
            self.options_file,
            self.weight_file,
            device=device,
            backend=backend,
            precision=precision,
            model_dir=self.model_dir,
            model_format=self.model_format,
        )
