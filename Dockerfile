# GPU image of the course: PyTorch with CUDA, the course, its data, JupyterLab.
#   docker build -t fast-gpt2 .
#   docker run --gpus all -p 8888:8888 fast-gpt2
# Every command below also runs in CI or a test (tests/test_packaging.py): the install, the data
# fetch and the JupyterLab entry point.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

WORKDIR /course
COPY . /course
# torch>=2.4 is already satisfied by the base image, so pip keeps its CUDA build.
RUN python -m pip install --no-cache-dir -e ".[test]"
# The data: verified from ./.course-data/ when the checkout holds the two files there (an offline
# build: copy a COURSE_DATA_DIR folder there first), else downloaded; kept in /opt/course-data.
ENV COURSE_DATA_DIR=/course/.course-data
RUN python -m helpers.core.data fetch --into /opt/course-data
ENV COURSE_DATA_DIR=/opt/course-data

EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root", "--notebook-dir=/course/notebooks"]
