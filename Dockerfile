# GPU image of the course: PyTorch with CUDA, the course, its data, JupyterLab.
#   docker build -t fast-gpt2 .
#   docker run --gpus all -p 8888:8888 fast-gpt2
# Every command below also runs in CI or a test (tests/test_packaging.py): the install, the data
# fetch and the JupyterLab entry point.
FROM python:3.12-slim

# torch.compile's Triton kernels and inductor's CPU code need a C/C++ compiler at run time.
RUN apt-get update && apt-get install -y --no-install-recommends gcc g++ \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /course
COPY . /course
# The oldest torch the course supports, the one its GPU results come from (pyproject.toml's floor).
# PyPI's Linux wheel is the CUDA build; it brings Triton and CUDA's libraries (the host needs only
# the NVIDIA driver and the container toolkit for --gpus).
RUN python -m pip install --no-cache-dir torch==2.11.0
RUN python -m pip install --no-cache-dir -e ".[test]"
# The data: verified from ./.course-data/ when the checkout holds the two files there (an offline
# build: copy a COURSE_DATA_DIR folder there first), else downloaded; kept in /opt/course-data.
ENV COURSE_DATA_DIR=/course/.course-data
RUN python -m helpers.core.data fetch --into /opt/course-data
ENV COURSE_DATA_DIR=/opt/course-data

EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root", "--notebook-dir=/course/notebooks"]
