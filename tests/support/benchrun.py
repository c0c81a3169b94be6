"""`localspec bench` on the tiny pair (target + noisy draft) as the bench tests run it: in-process, output captured."""

from __future__ import annotations

from localspec.cli.main import main


def bench_tiny(capsys, tiny_models, *extra: str) -> tuple[int, str, str]:
    """Run `localspec bench --target TINY --draft NOISY EXTRA…`: (exit code, stdout, stderr)."""
    code = main(["bench", "--target", str(tiny_models.target), "--draft", str(tiny_models.draft_noisy), *extra])
    out, err = capsys.readouterr()
    return code, out, err
