"""The built-in scenario's defaults: what a key a scenario file leaves out resolves to.

Keys are verl's (``ppo_trainer.yaml``); a command or verl scenario's defaults are built from these
(:func:`precision_harness.scenarios.command_scenario.defaults`).
"""

from __future__ import annotations

from typing import Any

from precision_harness.scenarios.profiling import GATE_STAGES, STAGES

DEFAULTS: dict[str, Any] = {
    "seed": 0,
    "device": "cpu",
    "model": {
        "path": None,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "attn_implementation": "eager",
        "attention_dropout": 0.0,
    },
    "data": {"source": "arithmetic", "train_batch_size": 4, "max_prompt_length": 16, "max_response_length": 8},
    # world_size is structural (in the hash when > 1); ray.* only says where the ranks run
    "trainer": {
        "total_training_steps": 2,
        "num_threads": 1,
        "world_size": 1,
        "cpu_kernels": "portable",
        "ray": {"num_cpus": 1, "resources": {}},
    },
    "actor_rollout_ref": {
        "actor": {
            "ppo_mini_batch_size": 2,
            "ppo_micro_batch_size_per_gpu": 2,
            "ppo_epochs": 1,
            "clip_ratio": 0.2,
            "clip_ratio_low": None,
            "clip_ratio_high": None,
            "clip_ratio_c": 3.0,
            "loss_agg_mode": "token-mean",
            "entropy_coeff": 0.0,
            "use_kl_loss": False,
            "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl",
            "grad_clip": 1.0,
            "dtype": "float32",
            "optim": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 0.01, "eps": 1e-8},
        },
        "rollout": {"n": 1, "temperature": 1.0, "dtype": "float32", "log_prob_micro_batch_size_per_gpu": 4},
        "ref": {"log_prob_micro_batch_size_per_gpu": 4},
    },
    "critic": {
        "enable": None,
        "ppo_mini_batch_size": 2,
        "ppo_micro_batch_size_per_gpu": 2,
        "ppo_epochs": 1,
        "cliprange_value": 0.5,
        "loss_agg_mode": "token-mean",
        "grad_clip": 1.0,
        "optim": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 0.01, "eps": 1e-8},
    },
    "reward_model": {"enable": False, "micro_batch_size_per_gpu": 4},
    "algorithm": {
        "adv_estimator": "gae",
        "gamma": 1.0,
        "lam": 1.0,
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
        "kl_penalty": "kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.001, "target_kl": 0.1, "horizon": 10000},
        "rollout_is": False,
        "rollout_is_threshold": None,
        "rollout_is_threshold_lower": None,
        "rollout_is_level": "token",
        "rollout_is_mode": "truncate",
        # verl PR #3694's default (its AlgoConfig): a token with ratio < 1e-4 vetoes its sequence
        "rollout_is_veto_threshold": 1e-4,
    },
    "global_profiler": {
        "tool": "precision_debugger",
        "steps": None,
        "global_tool_config": {
            "precision_debugger": {
                "stages": [s for s in STAGES if s not in GATE_STAGES],
                "strict": False,
                "config_path": None,
                "task": "statistics",
                "level": "L1",
                "scope": [],
                "list": [],
                "rank": [],
                "data_mode": ["all"],
                "summary_mode": "statistics",
            }
        },
    },
    "tolerance": {
        "mode": "tolerance",
        "dtypes": {},
        "stages": {},
        "statistics": {},
        "apis": {},
        "metrics": {},
        "cross_device": {},
    },
}


def uses_critic(config: dict[str, Any]) -> bool:
    """``critic.enable``, or (null, the default) whether the advantage estimator is GAE, as verl decides it."""
    enable = config["critic"]["enable"]
    return config["algorithm"]["adv_estimator"] == "gae" if enable is None else bool(enable)
