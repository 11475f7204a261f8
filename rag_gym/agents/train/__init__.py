"""Training LLM policies in rag_gym envs: GRPO/DAPO with multi-turn rollouts
(:mod:`~rag_gym.agents.train.grpo`), the papers' recipes (:mod:`~rag_gym.agents.train.recipes`),
EVO-RAG's DPO (:mod:`~rag_gym.agents.train.evo_rag_dpo`).

Needs ``pip install torch==2.13.0 && pip install 'rag-gym[train]'``; nothing here is imported by
``import rag_gym``.
"""
