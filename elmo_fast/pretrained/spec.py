"""What ``--model`` (and ``model=``) names, parsed and checked before anything is fetched.

* ``default`` (or ``default-v1``): a model bundled in the package;
* an official model's name (``small``, ``original``, ...): allennlp's files, fetched once;
* ``hf:OWNER/REPO[@REVISION][/SUBFOLDER]``: a repository of the Hugging Face Hub (a revision holding
  ``/``, such as ``refs/pr/1``, is written with ``%2F``);
* ``URL#sha256=HEX``: a folder on a web server holding ``options.json`` and ``weights.hdf5``, the weights
  pinned by their SHA-256.

Parsing needs no network and no optional package: a command refuses a malformed name at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ..errors import ElmoFastError
from .bundled import BUNDLED
from .bundled import NAME as BUNDLED_NAME
from .official import MODELS

__all__ = ["BundledSpec", "HubSpec", "ModelSpec", "OfficialSpec", "UrlSpec", "parse_model_spec", "FORMS"]

HUB_PREFIX = "hf:"
#: the forms a model may be named in, for messages
FORMS = "'default' (or 'default-v1'), an official name, hf:OWNER/REPO[@REVISION][/SUBFOLDER], or URL#sha256=HEX"

_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class BundledSpec:
    """A model bundled in the package (``default`` unless named)."""

    name: str = BUNDLED_NAME

    @property
    def text(self) -> str:
        return self.name


@dataclass(frozen=True)
class OfficialSpec:
    """An official model (allennlp's S3 files), by name."""

    name: str

    @property
    def text(self) -> str:
        return self.name


@dataclass(frozen=True)
class HubSpec:
    """A Hugging Face Hub repository: ``repo`` is ``OWNER/REPO``; ``revision`` None is the Hub's default
    branch; ``subfolder`` None is the repository's root."""

    repo: str
    revision: str | None = None
    subfolder: str | None = None

    @property
    def text(self) -> str:
        revision = f"@{self.revision.replace('/', '%2F')}" if self.revision else ""
        return f"{HUB_PREFIX}{self.repo}{revision}" + (f"/{self.subfolder}" if self.subfolder else "")


@dataclass(frozen=True)
class UrlSpec:
    """A folder on a web server (``base_url``, no trailing slash) holding options.json and weights.hdf5;
    ``sha256``: the weights file's digest."""

    base_url: str
    sha256: str

    @property
    def text(self) -> str:
        return f"{self.base_url}#sha256={self.sha256}"


ModelSpec = BundledSpec | OfficialSpec | HubSpec | UrlSpec


def _hub(text: str) -> HubSpec:
    rest = text[len(HUB_PREFIX) :]
    parts = rest.split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ElmoFastError(f"model {text!r}: a Hub model is hf:OWNER/REPO[@REVISION][/SUBFOLDER]")
    owner, name, sub = parts[0], parts[1], parts[2:]
    revision = None
    if "@" in name:
        name, revision = name.split("@", 1)
        revision = unquote(revision)
        if not revision:
            raise ElmoFastError(f"model {text!r}: an empty revision after '@' (leave '@' out for the default branch)")
    for part in (owner, name):
        if not _HUB_NAME.fullmatch(part):
            raise ElmoFastError(
                f"model {text!r}: {part!r} is not a Hub owner or repository name (letters, digits, '.', '_', '-')"
            )
    if any(p in ("", ".", "..") for p in sub):
        raise ElmoFastError(f"model {text!r}: the subfolder must be a plain path inside the repository")
    return HubSpec(f"{owner}/{name}", revision, "/".join(sub) or None)


def _url(text: str) -> UrlSpec:
    base, _, fragment = text.partition("#")
    if not fragment.startswith("sha256="):
        raise ElmoFastError(
            f"model {text!r}: a model by URL needs its weights file's SHA-256 as a pin, URL#sha256=HEX "
            "(the URL of a folder holding options.json and weights.hdf5; `sha256sum weights.hdf5` gives HEX)"
        )
    digest = fragment[len("sha256=") :].lower()
    if not _SHA256.fullmatch(digest):
        raise ElmoFastError(f"model {text!r}: the pin must be 64 hexadecimal digits, got {len(digest)} characters")
    parts = urlsplit(base)
    if not parts.netloc:
        raise ElmoFastError(f"model {text!r}: no host in the URL")
    if parts.query:
        raise ElmoFastError(f"model {text!r}: the URL of a folder takes no query ('?...')")
    return UrlSpec(base.rstrip("/"), digest)


def parse_model_spec(text: str) -> ModelSpec:
    """The model ``text`` names (see the module's docstring); a one-line error for anything else."""
    if not isinstance(text, str) or not text:
        raise ElmoFastError(f"model {text!r}: give {FORMS}")
    if text in BUNDLED:
        return BundledSpec(text)
    if text in MODELS:
        return OfficialSpec(text)
    if text.startswith(HUB_PREFIX):
        return _hub(text)
    scheme = urlsplit(text).scheme
    if scheme in ("http", "https"):
        return _url(text)
    names = ", ".join([*BUNDLED, *MODELS])
    raise ElmoFastError(
        f"unknown model {text!r}; valid names: {names}; or hf:OWNER/REPO[@REVISION][/SUBFOLDER], or URL#sha256=HEX"
    )
