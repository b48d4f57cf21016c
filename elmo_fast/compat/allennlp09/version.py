"""The version the stand-in answers to: allennlp 0.9's API (``+elmo_fast``: elmo-fast underneath)."""

VERSION = "0.9.0+elmo_fast"
