# Sourced by the setup scripts: apt_missing WHO PACKAGE... installs, with apt-get and without
# recommends, those of the Debian packages that are not installed yet (sudo when not root).
apt_missing() {
    local who=$1 p missing=() SUDO=""
    shift
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then echo "$who: Debian packages present"; return 0; fi
    echo "$who: installing ${missing[*]}"
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
}
