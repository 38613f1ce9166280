# Sourced by the demo scripts. `free_ports N` prints N distinct free TCP ports
# on 127.0.0.1, separated by spaces. All N sockets are bound at once, so no two
# ports are equal (asking N times for one free port can return the same one
# twice, and then two services collide on it).
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
