"""Every native call into llama.cpp (through llama-cpp-python's ctypes API) lives in this package.

Models, contexts, the log bridge, chat templates, devices, thread policy, RPC workers, the pairing rules,
llama.cpp's own sampler chain (`sampler.py`, the yardstick `localspec bench` times ours against), this CPU against
the build (`cpu.py`) and the canary that decodes each quantization type in a child process (`canary.py`).
It is the only package that imports `llama_cpp`, and it imports nothing of ours but `localspec.errors`.
"""
