# Sourced first by the shell scripts: -h / --help as the first argument prints the calling script's
# header comment and exits 0, before anything is installed, downloaded or trained; `usage_error`
# reports arguments the script does not take (one error line, exit 2).
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi

usage_error() {
  echo "error: $(basename "$0") $1; see --help" >&2
  exit 2
}
