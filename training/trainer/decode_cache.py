"""Room for the decode loop's new keys and values, reserved in a transformers cache after the
prefill (`sampling.decode_from`), so that a decode step writes one position in place instead
of concatenating (copying) the whole cache at every layer and step."""

from __future__ import annotations

import functools

import torch


class _ReservedLayer:
    """A transformers `DynamicLayer` whose keys and values live at the front of buffers with
    room for more tokens: a decode step writes its one position in place, where the
    dynamic layer concatenates (copies) the whole cache at every layer and step. Grows by
    concatenation, as before, once the room is used up."""

    def __init__(self, layer, room: int):
        self.__dict__.update(layer.__dict__)
        self._dynamic = type(layer)
        shape = list(layer.keys.shape)
        length = shape[-2]
        shape[-2] = length + room
        self._key_room = layer.keys.new_empty(shape)
        self._value_room = layer.values.new_empty(shape)
        self._key_room[..., :length, :] = layer.keys
        self._value_room[..., :length, :] = layer.values
        self.keys = self._key_room[..., :length, :]
        self.values = self._value_room[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        length, more = self.keys.shape[-2], key_states.shape[-2]
        if length + more > self._key_room.shape[-2]:
            return self._dynamic.update(self, key_states, value_states, *args, **kwargs)
        self._key_room[..., length : length + more, :] = key_states
        self._value_room[..., length : length + more, :] = value_states
        self.keys = self._key_room[..., : length + more, :]
        self.values = self._value_room[..., : length + more, :]
        return self.keys, self.values


def cache_reserve(cache, room: int) -> None:
    """Give each plain dynamic layer of a transformers cache `room` more positions up front
    (`_ReservedLayer`); sliding-window, static and other layers are left as they are."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or room < 1:
        return
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys.dim() == 4:
            layers[i] = _reserved_class()(layer, room)


def cache_unreserve(cache) -> None:
    """Turn `cache_reserve`'s layers back into plain dynamic layers holding what was written
    (views of the buffers), so a cache used after the decode loop reorders, repeats and
    grows as transformers' own does."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None) or []
    for i, layer in enumerate(layers):
        if isinstance(layer, _ReservedLayer):
            plain = DynamicLayer.__new__(DynamicLayer)
            plain.__dict__.update(
                {k: v for k, v in layer.__dict__.items() if k not in ("_key_room", "_value_room", "_dynamic")}
            )
            layers[i] = plain


@functools.cache
def _reserved_class() -> type:
    """`_ReservedLayer` as a `DynamicLayer` (built on first use: transformers is not
    imported with this module)."""
    from transformers.cache_utils import DynamicLayer

    return type("ReservedDynamicLayer", (_ReservedLayer, DynamicLayer), {})
