"""``captionrl serve reward --config FILE``: run the reward service (see ``captionrl.serve``).

Exposes ``CONFIG`` (``serve.config.RewardServiceConfig``) and ``run_command(cfg)``, the command
convention every ``captionrl`` command follows, and ``make_server``, the uvicorn server tests run in a thread.
"""

from __future__ import annotations

import logging
from typing import Any

from captionrl.serve.config import RewardServiceConfig, build_judge

logger = logging.getLogger(__name__)

CONFIG = RewardServiceConfig


def make_server(cfg: RewardServiceConfig, judge: Any = None) -> Any:
    """A ``uvicorn.Server`` for the service (not started): ``server.run()`` blocks, tests run it in a thread."""
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - the serve extra is missing
        from captionrl.errors import ConfigError

        raise ConfigError("serve", "uvicorn", "the reward service needs starlette and uvicorn",
                          "pip install 'captionrl[serve]'") from exc
    from captionrl.serve.app import create_app

    app = create_app(cfg, judge if judge is not None else build_judge(cfg))
    return uvicorn.Server(uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level,
                                         access_log=False))


def run_command(cfg: RewardServiceConfig) -> int:
    judge = build_judge(cfg)
    logger.info(f"reward service: {cfg.reward} ({getattr(judge, 'name', '?')}) on http://{cfg.host}:{cfg.port}/reward "
                f"(health: /health; records: {cfg.records or 'off'})")
    make_server(cfg, judge).run()
    return 0
