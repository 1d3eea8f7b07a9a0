"""The agent's inventory sources for the components bulletins name: packages, pip metadata, images."""

from __future__ import annotations

from gpusweep_agent.facts import components_of, image_components, os_family, pip_components


def test_it_reads_doca_ofed_cuda_toolkit_and_the_exporter_from_packages():
    assert components_of({
        "doca-runtime": "2.9.1-0.5.3", "mlnx-ofed-kernel-utils": "24.10.OFED.24.10.0.7.0.1-1",
        "cuda-toolkit-12-6": "12.6.2-1", "datacenter-gpu-manager-exporter": "1:4.1.1-1",
        "datacenter-gpu-manager-4-core": "1:4.2.3-1",
    }) == {"doca": "2.9.1", "mlnx_ofed": "24.10.OFED.24.10.0.7.0.1", "cuda_toolkit": "12.6.2",
           "dcgm_exporter": "4.1.1", "dcgm": "4.2.3"}


def test_it_reads_nemo_tensorrt_llm_and_dynamo_from_pip_metadata():
    assert pip_components({"nemo_toolkit": "2.1.0rc2", "TensorRT-LLM": "0.18.1", "ai-dynamo": "0.3.0",
                           "numpy": "2.1.0"}) == {"nemo": "2.1.0rc2", "tensorrt_llm": "0.18.1", "dynamo": "0.3.0"}


def test_it_reads_versions_from_ngc_image_tags_the_oldest_winning():
    assert image_components([
        "nvcr.io/nvidia/tritonserver:24.11-py3", "nvcr.io/nvidia/tritonserver:25.01-trtllm-python-py3",
        "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", "nvcr.io/nvidia/nemo:24.12",
        "docker.io/library/ubuntu:22.04",
    ]) == {"triton": "24.11", "dcgm_exporter": "3.6.1", "nemo": "24.12"}


def test_a_tegra_board_is_a_jetson_not_an_x86_linux_node():
    assert os_family("Linux", tegra=True) == "jetson"
    assert os_family("Linux", tegra=False) == "linux"
