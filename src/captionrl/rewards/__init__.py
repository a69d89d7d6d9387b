"""Rewards: the one reward object and its configuration, shaping and lost-reward bound.

``spec.RewardSpec`` is the ``reward:`` section every recipe, the reward service and the engine adapters
read; ``reward.build_reward`` turns it into the ``reward.Reward`` that scores captions into shaped
judgments; ``trl_face.RewardFunction`` is that reward as a TRL reward callable (``serve`` and ``adapters``
are its other faces). ``RewardFunction`` and ``completion_text`` are re-exported here.
"""

from captionrl.rewards.trl_face import RewardFunction, completion_text

__all__ = ["RewardFunction", "completion_text"]
