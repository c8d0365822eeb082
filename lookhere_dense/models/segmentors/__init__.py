"""Segmentors (registered in mmseg's ``MODELS``)."""

from .encoder_decoder import LeanEncoderDecoder

__all__ = ['LeanEncoderDecoder']
