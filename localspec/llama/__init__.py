"""Every native call into llama.cpp (through llama-cpp-python's ctypes API) lives in this package.

Models, contexts, the log bridge (llama.cpp's lines on their own `llama.cpp` channel), chat templates, text
vocabularies, devices, thread policy, RPC workers, the pairing rules, a GGUF's memory from its header and llama.cpp's
own count of it (`footprint.py`), MTP heads (`mtp.py`), llama.cpp's own sampler chains (`sampler.py`: the target's
law where the chain builds it, and the yardstick `localspec bench` times ours against), this CPU against the build
(`cpu.py`) and the canary that decodes each quantization type in a child process (`canary.py`).
It is the only package that imports `llama_cpp`, and it imports nothing of ours but `localspec.errors`.
"""
