# Sourced by the tools' build scripts (tools/kubecluster/build.sh, tools/kubenode/build.sh): find_go WHAT sets GO
# (and GOROOT where needed) to a Go >= 1.21, installing one as root where none is. One copy of this logic.
# A Go >= 1.21 is enough: the go.mod files ask for 1.25 and GOTOOLCHAIN=auto fetches that toolchain from the Go
# module proxy. Where none is installed: Debian 13's golang-go (1.24); on Debian 12 (1.19 is too old) Debian 13's
# golang-1.24 packages unpacked into a private prefix (Go is statically linked: no system library is touched).
# shellcheck shell=bash
go_ok() { "$1" version 2>/dev/null | grep -qE 'go1\.(2[1-9]|[3-9][0-9])'; }
find_go() {  # find_go WHAT: WHAT names the build in the error message
  GO=$(command -v go || true)
  [ -n "$GO" ] && go_ok "$GO" || GO=/usr/local/go/bin/go
  if ! go_ok "$GO"; then
    [ "$(id -u)" = 0 ] || { log "Go >= 1.21 is needed to build $1 (or run this as root)"; return 1; }
    export DEBIAN_FRONTEND=noninteractive
    case "$(cut -d. -f1 /etc/debian_version 2>/dev/null || echo 0)" in
      12)
        local prefix=/opt/gpudefrag/go-root apt_dir=/var/lib/gpudefrag/apt-trixie mirror opts deb
        mirror=$(grep -hoE 'https?://[^ ]+/debian/?$' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
                 2>/dev/null | grep -v security | head -1 || true)
        mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial" "$prefix"
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror:-http://deb.debian.org/debian} trixie main" \
          > "$apt_dir/sources.list"
        opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache::archives=$apt_dir/archives" -o "APT::Get::List-Cleanup=0")
        log "fetching Debian 13's Go 1.24 into $prefix"
        apt-get "${opts[@]}" update -qq >/dev/null
        (cd "$apt_dir/archives" && apt-get "${opts[@]}" download golang-1.24-go golang-1.24-src >/dev/null)
        for deb in "$apt_dir"/archives/golang-1.24-*.deb; do dpkg-deb -x "$deb" "$prefix"; done
        GO=$prefix/usr/lib/go-1.24/bin/go
        export GOROOT=$prefix/usr/lib/go-1.24
        ;;
      *) apt-get update -qq >/dev/null; apt-get install -y -qq --no-install-recommends golang-go >/dev/null
         GO=$(command -v go) ;;
    esac
    go_ok "$GO" || { log "no usable Go (>= 1.21) after install"; return 1; }
  fi
  export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
}
