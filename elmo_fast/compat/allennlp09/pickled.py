"""allennlp 0.9's biLM classes, under their names, for one job: unpickling objects that allennlp 0.9
pickled (an ``ElmoEmbedder`` inside a flair model saved before flair 0.12, say). Each holds what it
unpickled until the ``_ElmoBiLm`` holding it (:class:`~.modules_elmo._ElmoBiLm`) reads their options,
weights and carried states into elmo-fast's biLM; none of them runs. Building one directly is an
error saying what to use instead."""

from __future__ import annotations

from torch import nn

from ...errors import ElmoFastError

__all__ = ["ElmoLstm", "Highway", "LstmCellWithProjection", "_EncoderBase"]


class _PickledOnly(nn.Module):
    def __init__(self, *args, **kwargs) -> None:
        raise ElmoFastError(
            f"{type(self).__name__}: allennlp 0.9's class is provided to unpickle objects saved "
            "with allennlp 0.9 only; build ELMo with "
            "allennlp.modules.elmo.Elmo or _ElmoBiLm (elmo-fast's, underneath)"
        )

    def forward(self, *args, **kwargs):
        raise ElmoFastError(
            f"{type(self).__name__} unpickled from allennlp 0.9 does not run alone: the _ElmoBiLm "
            "holding it is elmo-fast's biLM, which runs"
        )


class _EncoderBase(_PickledOnly):
    """allennlp.modules.encoder_base._EncoderBase (the stateful encoders' base)."""


class ElmoLstm(_EncoderBase):
    """allennlp.modules.elmo_lstm.ElmoLstm: its layers' weights and its carried ``_states``."""


class LstmCellWithProjection(_PickledOnly):
    """allennlp.modules.lstm_cell_with_projection.LstmCellWithProjection: one direction of one layer."""


class Highway(_PickledOnly):
    """allennlp.modules.highway.Highway: the char CNN's highway layers."""
