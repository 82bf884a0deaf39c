"""tokenswap: measure and reduce the modality gap of multimodal LLMs."""

__version__ = "0.1.0"
