# What scripts/engine-venv.sh and scripts/prepare-venv.sh share; sourced by both, after they define `say` and `die`
# and set PYTHON and UV.

# require_uv: UV names a uv executable, or die says how to get one.
require_uv() {
	command -v "$UV" >/dev/null ||
		die "$UV not found: \`make\` installs it (pyproject.toml pins it); by hand, \`pip install uv\` (or set UV=/path/to/uv)"
}

# ensure_venv DIR: a venv of $PYTHON at DIR without pip (uv installs into it); a half-made one (interrupted run,
# moved directory) is rebuilt rather than trusted.
ensure_venv() {
	local dir=$1
	if [[ -d "$dir" ]] && ! "$dir/bin/python" -c 'import sys' >/dev/null 2>&1; then
		say "$dir exists but its python is broken: recreating it"
		rm -rf "$dir"
	fi
	if [[ ! -x "$dir/bin/python" ]]; then
		say "creating $dir with $("$PYTHON" -V 2>&1)"
		"$PYTHON" -m venv --without-pip "$dir"
	fi
}
