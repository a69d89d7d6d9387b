"""captionrl: train captioners with reinforcement learning from verifiable rewards, and measure them."""

__version__ = "0.1.0"
