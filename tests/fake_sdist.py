"""A tiny sdist shaped like llama-cpp-python's, for the llama-server build without the real sources."""
import tarfile
from pathlib import Path


def fake_llama_sdist(tmp: Path, version: str = "0.0.1", says: str = "fake llama-server") -> Path:
    """``llama_cpp_python-<version>.tar.gz`` whose vendor/llama.cpp is a CMake project building a ``llama-server``
    that prints ``says``."""
    top = tmp / f"llama_cpp_python-{version}"
    src = top / "vendor" / "llama.cpp"
    src.mkdir(parents=True)
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.10)\nproject(fake C)\n"
        "set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)\nadd_executable(llama-server server.c)\n"
        # as the vendored tools/rpc/CMakeLists.txt: the RPC worker exists only with the RPC backend on
        "if(GGML_RPC)\n  add_executable(ggml-rpc-server rpc.c)\nendif()\n")
    (src / "rpc.c").write_text('#include <stdio.h>\nint main(void){puts("fake rpc-server");return 0;}\n')
    (src / "server.c").write_text(f'#include <stdio.h>\nint main(void){{puts("{says}");return 0;}}\n')
    sdist = tmp / f"{top.name}.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    return sdist
