# Sourced first by quickstart.sh and best_recipe.sh, which take their settings from environment
# variables only: -h / --help prints the calling script's header comment; any other argument is an
# error (exit 2) before anything is installed, downloaded or trained.
if [[ $# -gt 0 ]]; then
  case "$1" in
    -h|--help)
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
      exit 0
      ;;
    *)
      echo "error: $(basename "$0") takes no arguments (got '$1'); its settings are environment variables, see --help" >&2
      exit 2
      ;;
  esac
fi
