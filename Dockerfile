# The suite on a CUDA PyTorch image: `docker run --gpus all IMAGE` runs the quick grid and publishes the HTML.
#   docker build -t pitfalls .
#   docker run --gpus all --user "$(id -u):$(id -g)" \
#       -v "$PWD/results:/suite/results" -v "$PWD/html:/suite/html" pitfalls
# BASE_IMAGE is any image with python3 and a build of torch >= 2.4; the torch in it is the one measured. The
# default pairs the suite with torch 2.14.1 (CUDA 13.0, cuDNN 9), a version the suite has results for; pin it by
# digest for a build that can be repeated:
#   --build-arg BASE_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime@sha256:<digest>
# The base's name is kept in PITFALLS_IMAGE, which the probes and scripts/gpu-run record.
ARG BASE_IMAGE=pytorch/pytorch:2.14.1-cuda13.0-cudnn9-runtime
FROM ${BASE_IMAGE}

ARG BASE_IMAGE
# For an air-gapped build: --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/suite/wheelhouse, with the
# wheels (`pip download` on a connected machine) in ./wheelhouse of the build context.
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS
# git: asv reads the commit of the suite it measures; the checkout (with .git) is copied below. Its version is the
# base distribution's, whichever that is, so it is not pinned. /suite is made here for the suite's user: WORKDIR
# would make it root's, and bootstrap could not create .venv in it. git trusts /suite system-wide, so a run under
# any uid (docker run --user) can read the commit of a checkout that uid 1000 owns.
# hadolint ignore=DL3008
RUN if ! command -v git >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends git \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && useradd --create-home --uid 1000 pitfalls \
    && install -d -o 1000 -g 1000 /suite \
    && git config --system --add safe.directory /suite

WORKDIR /suite
COPY --chown=1000:1000 . /suite
USER 1000:1000

# PITFALLS_TORCH=none: keep the image's torch; the venv sees it through the system site-packages.
# HOME is fixed so that a uid with no passwd entry (docker run --user) still has a writable home for asv's
# machine file and matplotlib's cache.
ENV PITFALLS_TORCH=none \
    PITFALLS_IMAGE=${BASE_IMAGE} \
    PIP_NO_CACHE_DIR=1 \
    HOME=/home/pitfalls
# The image runs the main job: the venv holds what asv needs (the bench extra), not the test tools.
# Every place a run writes is open to any uid: asv's staging and environment folder, results/ and html/ when they
# are not mounted, and HOME. The venv and the checkout stay read-only to other uids, which is all a run needs.
RUN PITFALLS_EXTRAS=bench bash scripts/bootstrap \
    && mkdir -p .asv results html \
    && chmod -R a+rwX .asv results html "$HOME"

ENTRYPOINT ["bash", "scripts/run-suite"]
