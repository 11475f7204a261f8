"""Training policies in rag_gym envs: GRPO/DAPO with multi-turn rollouts
(:mod:`~rag_gym.train.grpo`), the papers' recipes (:mod:`~rag_gym.train.recipes`), EVO-RAG's DPO
(:mod:`~rag_gym.train.evo_rag_dpo`), and classic RL with Stable-Baselines3
(:mod:`~rag_gym.train.sb3`).

Needs ``pip install torch==2.13.0 && pip install 'rag-gym[train]'`` (``[sb3]`` for SB3); nothing
here is imported by ``import rag_gym``.
"""
