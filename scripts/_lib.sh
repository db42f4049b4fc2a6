# Shared helpers for scripts/test, scripts/prepare-e2e and scripts/lint-workflows.
# Source it; it defines functions and a few variables and runs nothing.
# shellcheck shell=bash

TDR_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TDR_PYTHON=${TDR_PYTHON:-python3.11}
TDR_CACHE_HOME=${XDG_CACHE_HOME:-$HOME/.cache}
TDR_TOOLS_HOME=${TDR_TOOLS_HOME:-$TDR_CACHE_HOME/tdr-tools}

tdr_log() {
	printf '[%s] %s\n' "${TDR_LOG_NAME:-tdr}" "$*" >&2
}

tdr_die() {
	tdr_log "ERROR: $*"
	exit 1
}

# Seconds since the epoch with sub-second precision (bash 5 has EPOCHREALTIME).
tdr_now() {
	if [[ -n ${EPOCHREALTIME:-} ]]; then
		printf '%s' "${EPOCHREALTIME/,/.}"
	else
		date +%s.%N
	fi
}

tdr_elapsed_since() {
	awk -v start="$1" -v end="$(tdr_now)" 'BEGIN { printf "%.1f", end - start }'
}

tdr_is_root() {
	[[ $(id -u) -eq 0 ]]
}

# The Open WebUI venv used by the end-to-end tests (one per Open WebUI version).
tdr_owui_venv_path() {
	printf '%s/owui-%s' "${TDR_OWUI_HOME:-$TDR_CACHE_HOME/tdr-owui}" "${OPEN_WEBUI_VERSION:-0.12.4}"
}

# Stable lock file outside the checkout, one per checkout path.
tdr_lock_file() {
	local name=$1
	local key
	key=$(printf '%s' "$TDR_ROOT" | sha256sum | cut -c1-12)
	printf '%s/tdr-%s-%s.lock' "${TMPDIR:-/tmp}" "$name" "$key"
}

# apt-get install as root, running `apt-get update` at most once per process.
# With TDR_APT_SUDO=1 a non-root user with passwordless sudo (a hosted CI
# runner) installs through `sudo -n` instead.
tdr_apt_install() {
	local sudo=()
	if ! tdr_is_root; then
		[[ ${TDR_APT_SUDO:-} == 1 ]] && sudo -n true >/dev/null 2>&1 || return 1
		sudo=(sudo -n)
	fi
	command -v apt-get >/dev/null 2>&1 || return 1
	if [[ -z ${TDR_APT_UPDATED:-} ]]; then
		tdr_log "apt-get update"
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || return 1
		TDR_APT_UPDATED=1
	fi
	tdr_log "apt-get install -y $*"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends "$@" >&2
}

# Fail early with a clear message when python3.11 cannot make virtual environments
# (Debian ships `venv`/`ensurepip` in a separate package).
tdr_require_python() {
	if ! command -v "$TDR_PYTHON" >/dev/null 2>&1; then
		tdr_apt_install python3.11 python3.11-venv ||
			tdr_die "$TDR_PYTHON not found (set TDR_PYTHON to a Python 3.11 interpreter)"
	fi
	if ! "$TDR_PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
		tdr_apt_install python3.11-venv ||
			tdr_die "$TDR_PYTHON cannot create virtual environments (install python3.11-venv)"
	fi
	"$TDR_PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' ||
		tdr_die "$TDR_PYTHON is not Python 3.11"
}

# True when the venv's interpreter exists and runs Python 3.11.
tdr_venv_usable() {
	local venv=$1
	[[ -x $venv/bin/python ]] &&
		"$venv/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1
}

# sha256 over the named files (path and content), missing files included as such.
tdr_hash_files() {
	local file
	for file in "$@"; do
		printf '%s\0' "$file"
		if [[ -f $file ]]; then
			sha256sum <"$file"
		else
			printf 'missing\n'
		fi
	done | sha256sum | cut -d' ' -f1
}
