"""A GGUF's footprint from its header against llama.cpp's own count, and the MoE experts kept on the CPU.

`simulate` loads a file with `no_alloc` (llama.cpp sizes every buffer and allocates none) and creates a context;
the sizes it reports are what the planner's arithmetic must match: the weights exactly, the KV cache to llama.cpp's
printed 0.01 MiB, the compute buffer within a stated tolerance. The real shapes are sparse files (support/shapes.py:
headers and tensor tables of 0.5B-30B models, no weights), which `no_alloc` loads without reading a weight.
"""

from __future__ import annotations

import logging

import pytest
from support import shapes
from support.tinymodels import Qwen35Shape, write_mamba_model, write_moe_model, write_mtp_model

from localspec.errors import ModelFileError
from localspec.llama.context import Context, kv_bytes_estimate
from localspec.llama.footprint import compute_bytes_estimate, read_footprint, simulate
from localspec.llama.model import Model

MIB = 2**20
PRINTED = MIB // 100 + 1  # llama.cpp prints MiB with two decimals


@pytest.mark.parametrize(
    ("shape", "quant"),
    [
        (shapes.QWEN25_14B, "Q4_K_M"),
        (shapes.QWEN25_0_5B, "Q8_0"),
        (shapes.LLAMA32_1B, "Q4_K_M"),
        (shapes.QWEN3_30B_A3B, "Q4_K_M"),
    ],
    ids=["qwen2.5-14b", "qwen2.5-0.5b", "llama3.2-1b", "qwen3-30b-a3b"],
)
def test_real_shapes_match_llama_cpps_own_count(tmp_path, shape, quant):
    path = shapes.write_shape(tmp_path / "m.gguf", shape, quant)
    footprint = read_footprint(path)
    for n_ctx in (512, 4096):
        counted = simulate(path, n_ctx=n_ctx)
        assert footprint.tensor_bytes == counted.model_bytes  # exact: the same tensor table
        assert abs(footprint.kv_bytes(n_ctx) - counted.kv_bytes) <= PRINTED
        # the compute buffer: within 2 % (to the MiB on these shapes, at any n_ctx: attention is fused)
        assert abs(compute_bytes_estimate(footprint, 512) - counted.compute_bytes) <= 0.02 * counted.compute_bytes
    assert footprint.is_moe == bool(shape.n_expert)
    assert (footprint.tied_bytes > 0) == shape.tied


def test_the_14b_shape_is_the_published_file(tmp_path):
    """bartowski's Qwen2.5-14B-Instruct-Q4_K_M.gguf is listed at 8.99 GB: the recipe's tensors come to that."""
    footprint = read_footprint(shapes.write_shape(tmp_path / "14b.gguf", shapes.QWEN25_14B))
    assert 8.95e9 < footprint.tensor_bytes < 9.0e9


def test_tiny_models_match_llama_cpps_own_count(tiny_models):
    for path in (tiny_models.target, tiny_models.swa, write_moe_model(tiny_models.target.parent / "moe_fp.gguf")):
        footprint, counted = read_footprint(path), simulate(path, n_ctx=256, n_ubatch=256)
        assert footprint.tensor_bytes == counted.model_bytes
        assert abs(footprint.kv_bytes(256) - counted.kv_bytes) <= PRINTED
        # tiny graphs: other buffers than the logits dominate; the estimate is then short by under 0.5 MiB
        assert abs(compute_bytes_estimate(footprint, 256) - counted.compute_bytes) < MIB // 2


def test_a_recurrent_model_has_no_kv_per_token(tiny_models):
    footprint = read_footprint(tiny_models.recurrent)
    assert footprint.recurrent and footprint.kv_bytes(4096) == 0


# Qwen3.5's layout at a tiny size: 8 trunk layers, each 4th full attention, the rest gated delta net with a state
# of ~140 KB each (so that llama.cpp's two-decimal MiB can tell a layer missing), and one MTP block
HYBRID = Qwen35Shape(n_layer=8, full_attention_interval=4, ssm_d_state=64, ssm_dt_rank=8, ssm_n_group=4)


@pytest.mark.parametrize("n_rs_seq", [0, 8], ids=["no-snapshots", "8-snapshots"])
def test_a_hybrid_counts_kv_for_its_attention_layers_and_a_state_for_the_others(tmp_path, n_rs_seq):
    path = write_mtp_model(tmp_path / "hybrid.gguf", shape=HYBRID)
    footprint = read_footprint(path).with_snapshots(n_rs_seq)
    counted = simulate(path, n_ctx=512, n_ubatch=256, n_rs_seq=n_rs_seq)
    # layers 3 and 7 hold the KV cache (the MTP block's lives in the head's own context); six hold a state
    assert [i for i, b in enumerate(footprint.kv_bytes_per_cell) if b] == [3, 7]
    assert sum(1 for b in footprint.state_bytes_per_layer if b) == 6
    assert abs(footprint.kv_bytes(512) - counted.kv_bytes) <= PRINTED
    assert counted.state_bytes > 6 * 2**17 * (1 + n_rs_seq) * 0.9  # the state is what the comparison is about
    assert abs(sum(footprint.state_bytes_per_layer) - counted.state_bytes) <= PRINTED


def test_the_ram_check_before_a_context_counts_a_hybrids_attention_layers_only(tmp_path):
    path = write_mtp_model(tmp_path / "hybrid.gguf", shape=HYBRID)
    with Model(path, n_gpu_layers=0) as model:
        assert model.info.is_hybrid
        kv_layer = read_footprint(path).kv_bytes_per_cell[3]
        assert kv_bytes_estimate(model.info, 4096) == 2 * 4096 * kv_layer  # layers 3 and 7, not all nine


def test_a_mamba_state_is_counted_and_has_no_snapshots(tmp_path):
    # llama.cpp keeps no rollback snapshots for mamba (it clamps n_rs_seq to 0): neither does the footprint
    path = write_mamba_model(tmp_path / "mamba.gguf", n_embd=256, n_layer=8)  # 8 states of 38 KiB
    footprint = read_footprint(path)
    assert all(footprint.state_bytes_per_layer)
    for n_rs_seq in (0, 8):
        counted = simulate(path, n_ctx=256, n_ubatch=256, n_rs_seq=n_rs_seq)
        assert counted.state_bytes > 0.25 * MIB
        assert abs(sum(footprint.with_snapshots(n_rs_seq).state_bytes_per_layer) - counted.state_bytes) <= PRINTED


def test_a_damaged_header_is_one_line(tmp_path, tiny_models):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_models.target.read_bytes()[:200])
    with pytest.raises(ModelFileError, match="truncated or corrupt") as e:
        read_footprint(broken)
    assert "\n" not in str(e.value)


class Lines(logging.Handler):
    """llama.cpp's log lines, kept (attached to its logger itself: other tests' logging set-up may stop propagation)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_experts_on_the_cpu_load_and_decode(tmp_path):
    """--cpu-moe through tensor_buft_overrides: llama.cpp says each expert tensor went to the CPU, and the model
    decodes the same logits as without (on a CPU-only build the override moves nothing)."""
    path = write_moe_model(tmp_path / "moe.gguf")
    llama_log = logging.getLogger("llama.cpp")
    rows = {}
    for n_layers in (0, 1, 2):
        kept, level = Lines(), llama_log.level
        llama_log.addHandler(kept)
        llama_log.setLevel(logging.DEBUG)
        try:
            with Model(path, n_gpu_layers=0, cpu_moe_layers=n_layers) as model, Context(model, n_ctx=64) as ctx:
                ctx.decode(model.tokenize("Hello world", add_special=True), 0)
                rows[n_layers] = ctx.logits(-1).copy()
        finally:
            llama_log.removeHandler(kept)
            llama_log.setLevel(level)
        moved = {line.split()[1] for line in kept.lines if "buffer type overridden to CPU" in line}
        expected = {f"blk.{i}.ffn_{w}_exps.weight" for i in range(n_layers) for w in ("gate", "up", "down")}
        assert moved == expected
    assert (rows[0] == rows[1]).all() and (rows[0] == rows[2]).all()
