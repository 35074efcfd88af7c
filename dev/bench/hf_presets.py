"""hf_presets.py: the presets of llmc/host/config.h that have an HF model class (LlamaForCausalLM,
Qwen3ForCausalLM), and their HF configs, for the PyTorch sides of the speed comparisons
(bench_torch.py on the CPU, bench_gpu_torch.py on the GPU), built as dev/reference/make_states.py does; the
order both read their batches in (batch_reader)."""

# The presets of llmc/host/config.h that have an HF model class here.
PRESETS = {
    "llama3.2-1b": dict(kind="llama", n_layer=16, d_model=2048, n_head=32, n_kv_head=8, head_dim=64, ffn_dim=8192,
                        vocab_size=128256, seq_len=1024, rope_theta=500000.0, norm_eps=1e-5, tied=1,
                        rope_factor=32.0, rope_low=1.0, rope_high=4.0, rope_orig=8192),
    "qwen3-0.6b": dict(kind="qwen3", n_layer=28, d_model=1024, n_head=16, n_kv_head=8, head_dim=128, ffn_dim=3072,
                       vocab_size=151936, seq_len=1024, rope_theta=1e6, norm_eps=1e-6, tied=1),
    "smollm2-135m": dict(kind="llama", n_layer=30, d_model=576, n_head=9, n_kv_head=3, head_dim=64, ffn_dim=1536,
                         vocab_size=49152, seq_len=1024, rope_theta=100000.0, norm_eps=1e-5, tied=1),
    "tiny-llama": dict(kind="llama", n_layer=4, d_model=128, n_head=4, n_kv_head=2, head_dim=32, ffn_dim=384,
                       vocab_size=8192, seq_len=128, rope_theta=500000.0, norm_eps=1e-5, tied=1,
                       rope_factor=32.0, rope_low=1.0, rope_high=4.0, rope_orig=8192),
    "tiny-qwen3": dict(kind="qwen3", n_layer=4, d_model=128, n_head=4, n_kv_head=2, head_dim=64, ffn_dim=384,
                       vocab_size=8192, seq_len=128, rope_theta=1e6, norm_eps=1e-6, tied=1),
}


def hf_config(cfg, T, attn):
    """The HF config of a preset (attn: "sdpa" or "eager"; T: the sequence length to support)."""
    from transformers import LlamaConfig, Qwen3Config
    common = dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["d_model"], intermediate_size=cfg["ffn_dim"],
                  num_hidden_layers=cfg["n_layer"], num_attention_heads=cfg["n_head"],
                  num_key_value_heads=cfg["n_kv_head"], head_dim=cfg["head_dim"], hidden_act="silu",
                  max_position_embeddings=max(T, cfg["seq_len"]), rms_norm_eps=cfg["norm_eps"],
                  tie_word_embeddings=bool(cfg["tied"]), attention_bias=False, attention_dropout=0.0,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, use_cache=False)
    if cfg["kind"] == "llama" and "rope_factor" not in cfg:   # plain RoPE (SmolLM2)
        return LlamaConfig(**common, mlp_bias=False, rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_theta"]},
                           attn_implementation=attn)
    if cfg["kind"] == "llama":
        rope = {"rope_type": "llama3", "rope_theta": cfg["rope_theta"], "factor": cfg["rope_factor"],
                "low_freq_factor": cfg["rope_low"], "high_freq_factor": cfg["rope_high"],
                "original_max_position_embeddings": int(cfg["rope_orig"])}
        return LlamaConfig(**common, mlp_bias=False, rope_parameters=rope, attn_implementation=attn)
    rope = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    return Qwen3Config(**common, rope_parameters=rope, use_sliding_window=False, sliding_window=None,
                       max_window_layers=cfg["n_layer"], attn_implementation=attn)


def batch_reader(data, B, T, device=None):
    """next_batch() for a benchmark: the next B sequences of T tokens of the 1-D token tensor `data` and their
    targets (shifted by one), read in order and from the start again at its end; on `device` when given"""
    import torch
    pos = 0

    def next_batch():
        nonlocal pos
        if pos + B * T + 1 > data.numel():
            pos = 0
        starts = pos + T * torch.arange(B)
        idx = starts[:, None] + torch.arange(T + 1)[None, :]
        buf = data[idx]
        pos += B * T
        x, y = buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
        return (x, y) if device is None else (x.to(device, non_blocking=True), y.to(device, non_blocking=True))
    return next_batch
