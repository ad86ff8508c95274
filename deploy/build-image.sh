#!/usr/bin/env bash
# `make image`: builds deploy/Dockerfile and tags it llm-health:<version of pyproject.toml>
# (docs/kubernetes.md, "Building the image").
#
#   bash deploy/build-image.sh          build (the tool and the base it picks are printed)
#   bash deploy/build-image.sh --tool   print the tool it would use: docker, podman, buildah
#   bash deploy/build-image.sh --ref    print the image reference it tags
#
# The tool: docker or podman when they work (`docker info` answers: a docker CLI without
# a daemon does not count), else Debian's buildah (rootless of any daemon; installed from
# Debian when missing, with debootstrap), which builds with `--isolation chroot`. Override
# with LLM_HEALTH_IMAGE_TOOL.
#
# The base (build argument PYTHON_IMAGE): $PYTHON_IMAGE if set; else the official
# python:3.11-slim-bookworm when it is present or can be pulled; else, on a machine that
# reaches no container registry, a Debian base made here with debootstrap from Debian's
# own packages (python3 with a pip that pip can uninstall, like the official image), once
# per machine: cached as a tarball under ~/.cache/llm-health/image-base (keyed by suite
# and recipe) and tagged localhost/llm-health-base:<suite>.
set -euo pipefail
cd "$(dirname "$0")/.."

OFFICIAL_BASE=docker.io/library/python:3.11-slim-bookworm
SUITE=${LLM_HEALTH_BASE_SUITE:-bookworm}
MIRROR=${LLM_HEALTH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${LLM_HEALTH_IMAGE_CACHE:-${XDG_CACHE_HOME:-$(echo ~)/.cache}/llm-health/image-base}
BASE_REF=localhost/llm-health-base:$SUITE
BASE_PACKAGES=python3,python-is-python3,python3-pip-whl,ca-certificates
# Run in the debootstrapped tree. Debian marks its python "externally managed" (PEP 668)
# and its pip belongs to dpkg; the Dockerfile's final stage installs wheels with pip and
# then uninstalls pip, as on the official image. So: pip from Debian's own pip wheel into
# /usr/local, where pip can remove it again; the marker removed (a container image is its
# own environment, as PEP 668 allows); no apt lists, documentation or man pages (the
# copyright files stay); no resolv.conf or hostname of the building machine.
CONFIGURE_ROOTFS='
set -e
rm -f /usr/lib/python3*/EXTERNALLY-MANAGED
wheel=$(ls /usr/share/python-wheels/pip-*.whl)
python3 "$wheel/pip" install --quiet --no-index --no-cache-dir --disable-pip-version-check \
  --root-user-action=ignore "$wheel"
dpkg --purge python3-pip-whl >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/cache/debconf/*-old
find /usr/share/doc -mindepth 1 ! -name copyright ! -type d -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man/* /usr/share/info/* /usr/share/locale/*
rm -f /etc/resolv.conf
: > /etc/hostname
python -m pip --version >/dev/null
'
BASE_RECIPE=$(printf '%s\n' "$SUITE" "$BASE_PACKAGES" "$CONFIGURE_ROOTFS" | sha256sum | cut -c1-12)
BASE_TARBALL=$CACHE/$SUITE-$BASE_RECIPE.tar
BASE_ENV=(LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
BASE_LABEL=llm-health.base-recipe
BUILDER_REF=localhost/llm-health-builder:cache

say() { echo "image: $*" >&2; }

version() {
    python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])'
}

pick_tool() {
    if [ -n "${LLM_HEALTH_IMAGE_TOOL:-}" ]; then
        echo "$LLM_HEALTH_IMAGE_TOOL"
        return
    fi
    local tool
    for tool in docker podman; do
        if command -v "$tool" >/dev/null 2>&1 && timeout 30 "$tool" info >/dev/null 2>&1; then
            echo "$tool"
            return
        fi
    done
    echo buildah
}

# Debian packages (command:package), installed only when the command is missing, like the
# Makefile's `tools` target. Only called as root (buildah's chroot builds and debootstrap
# need root anyway).
need() {
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    [ ${#missing[@]} -eq 0 ] && return
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
}

need_root() {
    if [ "$(id -u)" -ne 0 ]; then
        say "$1 needs root: $2"
        exit 1
    fi
}

image_label() { # ref label -> the label's value, empty if the image is absent
    case $TOOL in
        buildah) buildah inspect --type image --format "{{ index .OCIv1.Config.Labels \"$2\" }}" "$1" ;;
        *) "$TOOL" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" ;;
    esac 2>/dev/null || true
}

image_present() {
    case $TOOL in
        buildah) buildah inspect --type image "$1" >/dev/null 2>&1 ;;
        *) "$TOOL" image inspect "$1" >/dev/null 2>&1 ;;
    esac
}

pull() {
    case $TOOL in
        buildah) timeout 300 buildah pull --quiet "$1" >/dev/null 2>&1 ;;
        *) timeout 300 "$TOOL" pull --quiet "$1" >/dev/null 2>&1 ;;
    esac
}

# The debootstrapped tree as a tarball in the cache (once; a few minutes).
make_base_tarball() {
    need_root "making the base with debootstrap" \
        "sudo make image, or PYTHON_IMAGE=<a python 3.11 image you have> make image"
    need debootstrap:debootstrap
    mkdir -p "$CACHE"
    WORK=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap remove_work EXIT
    say "debootstrap $SUITE from $MIRROR (packages $BASE_PACKAGES)"
    if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$WORK/rootfs" \
        "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
        tail -n 30 "$WORK/debootstrap.log" >&2
        return 1
    fi
    chroot "$WORK/rootfs" /bin/sh -c "$CONFIGURE_ROOTFS"
    tar --numeric-owner -C "$WORK/rootfs" -cf "$BASE_TARBALL.part" .
    mv "$BASE_TARBALL.part" "$BASE_TARBALL"
    find "$CACHE" -maxdepth 1 -name "$SUITE-*.tar" ! -name "${BASE_TARBALL##*/}" -delete
    remove_work
    trap - EXIT
}

# debootstrap mounts /proc and /sys in the tree while it works: unmount before removing.
remove_work() {
    umount -R "$WORK/rootfs/proc" "$WORK/rootfs/sys" 2>/dev/null || true
    if grep -q " $WORK/" /proc/mounts; then
        say "left $WORK in place: something is still mounted in it"
        return
    fi
    rm -rf "$WORK" "$BASE_TARBALL.part"
}

import_base_tarball() {
    case $TOOL in
        buildah)
            local ctr env=()
            for pair in "${BASE_ENV[@]}"; do env+=(--env "$pair"); done
            ctr=$(buildah from scratch)
            buildah add --quiet "$ctr" "$BASE_TARBALL" / >/dev/null
            buildah config "${env[@]}" --label "$BASE_LABEL=$BASE_RECIPE" --cmd '["python3"]' "$ctr"
            buildah commit --quiet --rm "$ctr" "$BASE_REF" >/dev/null
            ;;
        *)
            local changes=()
            for pair in "${BASE_ENV[@]}"; do changes+=(--change "ENV $pair"); done
            "$TOOL" import "${changes[@]}" --change "LABEL $BASE_LABEL=$BASE_RECIPE" \
                --change 'CMD ["python3"]' "$BASE_TARBALL" "$BASE_REF" >/dev/null
            ;;
    esac
}

debian_base() {
    if [ "$(image_label "$BASE_REF" "$BASE_LABEL")" = "$BASE_RECIPE" ]; then
        return
    fi
    if [ ! -f "$BASE_TARBALL" ]; then
        say "making the Debian $SUITE base with debootstrap (once per machine; cached in $CACHE)"
        make_base_tarball
    fi
    say "importing $BASE_TARBALL as $BASE_REF"
    import_base_tarball
}

pick_base() {
    if [ -n "${PYTHON_IMAGE:-}" ]; then
        BASE=$PYTHON_IMAGE
        say "base $BASE (from \$PYTHON_IMAGE)"
    elif image_present "$OFFICIAL_BASE"; then
        BASE=$OFFICIAL_BASE
        say "base $BASE"
    elif [ "$(image_label "$BASE_REF" "$BASE_LABEL")" = "$BASE_RECIPE" ]; then
        BASE=$BASE_REF
        say "base $BASE (made with debootstrap; cached)"
    elif pull "$OFFICIAL_BASE"; then
        BASE=$OFFICIAL_BASE
        say "base $BASE (pulled)"
    else
        say "no container registry reachable ($OFFICIAL_BASE cannot be pulled)"
        debian_base
        BASE=$BASE_REF
        say "base $BASE (made with debootstrap from Debian's packages)"
    fi
}

# buildah and podman run the RUN steps with the host's CA bundle mounted over the base's
# (not committed to the image), so pip in the builder trusts what this machine trusts,
# e.g. a TLS-intercepting proxy's CA; Debian's pip reads that file.
ca_volume() {
    local bundle=/etc/ssl/certs/ca-certificates.crt
    [ -f "$bundle" ] && printf '%s\n' --volume "$bundle:$bundle:ro"
    return 0
}

build() {
    local args=(-f deploy/Dockerfile --build-arg "PYTHON_IMAGE=$BASE" -t "$1") volumes
    mapfile -t volumes < <(ca_volume)
    case $TOOL in
        docker) DOCKER_BUILDKIT=1 docker build "${args[@]}" . ;;
        podman) podman build --ignorefile deploy/Dockerfile.dockerignore "${volumes[@]}" "${args[@]}" . ;;
        buildah)
            local buildah=(buildah build --isolation chroot --layers --force-rm
                --ignorefile deploy/Dockerfile.dockerignore "${volumes[@]}")
            # The builder stage tagged too, so that pruning keeps its cached layers (the
            # dependencies' wheels) while it drops what earlier builds left.
            "${buildah[@]}" --target builder -t "$BUILDER_REF" "${args[@]}" .
            "${buildah[@]}" "${args[@]}" .
            buildah rmi --prune >/dev/null 2>&1 || true
            ;;
        *)
            say "unknown tool $TOOL (docker, podman or buildah)"
            return 2
            ;;
    esac
}

image_size() {
    case $TOOL in
        buildah) buildah images --format '{{.Size}}' "$1" | head -n 1 ;;
        *) "$TOOL" image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB\n", $1 / 1e6}' ;;
    esac
}

TOOL=$(pick_tool)
REF=llm-health:$(version)
case ${1:-} in
    --tool) echo "$TOOL"; exit 0 ;;
    --ref) echo "$REF"; exit 0 ;;
    "") ;;
    *) say "usage: $0 [--tool|--ref]"; exit 2 ;;
esac

if [ "$TOOL" = buildah ]; then
    need_root "building without a working docker or podman (buildah --isolation chroot)" \
        "sudo make image"
    need buildah:buildah debootstrap:debootstrap
fi
say "building $REF with $TOOL"
started=$(date +%s)
pick_base
if ! build "$REF"; then
    say "FAILED: $TOOL could not build deploy/Dockerfile (the failing step is above)"
    exit 1
fi
say "built $REF with $TOOL in $(($(date +%s) - started)) s; size $(image_size "$REF")"
