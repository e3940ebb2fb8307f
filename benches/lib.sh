# Shared by the benches' scripts (source it): start tiergate and wait until it is ready.

# start_tiergate CONFIG PORT ADMIN_PORT LOG [BIN]: `tiergate serve` with CONFIG on 127.0.0.1:PORT
# (admin ADMIN_PORT), output to LOG; BIN defaults to target/release/tiergate. Sets SERVER (the
# pid) and returns once /readyz answers 200; exits with LOG's tail if the server dies first or
# is not ready within 30 s.
start_tiergate() {
    local config="$1" port="$2" admin_port="$3" log="$4" bin="${5:-target/release/tiergate}"
    "$bin" serve --config "$config" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin_port" > "$log" 2>&1 &
    SERVER=$!
    for _ in $(seq 300); do
        curl -sf -o /dev/null "http://127.0.0.1:$port/readyz" && return 0
        kill -0 "$SERVER" 2>/dev/null || { tail -5 "$log" >&2; exit 1; }
        sleep 0.1
    done
    echo "tiergate on port $port was not ready within 30 s" >&2
    tail -5 "$log" >&2
    exit 1
}

# free_port: a TCP port free on 127.0.0.1 now (the kernel's pick).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
