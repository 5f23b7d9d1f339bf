# The suite on a CUDA PyTorch image: `docker run --gpus all IMAGE` runs the quick grid and publishes the HTML.
#   docker build -t pitfalls .
#   docker run --gpus all -v "$PWD/results:/suite/results" -v "$PWD/html:/suite/html" pitfalls
# BASE_IMAGE is any image with python3 and a CUDA build of torch (the suite runs on torch >= 2.4); the torch in
# it is the one measured, so the image tag names the torch version of the results.
ARG BASE_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ARG BASE_IMAGE
# For an air-gapped build: --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/suite/wheelhouse, with the
# wheels (`pip download` on a connected machine) in ./wheelhouse of the build context.
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
# git: asv reads the commit of the suite it measures; the checkout (with .git) is copied below. Its version is the
# base distribution's, whichever that is, so it is not pinned.
# hadolint ignore=DL3008
RUN if ! command -v git >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends git \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --create-home --uid 1000 pitfalls

WORKDIR /suite
COPY --chown=pitfalls:pitfalls . /suite
USER 1000:1000

# PITFALLS_TORCH=none: keep the image's CUDA torch; the venv sees it through the system site-packages.
ENV PITFALLS_TORCH=none \
    PITFALLS_IMAGE=${BASE_IMAGE} \
    PIP_NO_CACHE_DIR=1
RUN git config --global --add safe.directory /suite && bash scripts/bootstrap

ENTRYPOINT ["bash", "scripts/run-suite"]
