"""Every native call into llama.cpp (through llama-cpp-python's ctypes API) lives in this package.

Models, contexts, the log bridge, chat templates, devices, thread policy, RPC workers and the pairing rules.
It is the only package that imports `llama_cpp`, and it imports nothing of ours but `localspec.errors`.
"""
