"""A TCP proxy on 127.0.0.1 that damages a file on its way back from the coordinator, the way a
faulty link or NIC would: each byte sequence in `needles` (pieces of the file, in hex) marks the
file's bytes in the server-to-client stream, and the last byte of the first `times` sequences
seen is flipped. Nothing else is touched, so the gRPC framing stays valid and only the file's
hash check can notice. Used by the download tests (tests/job_files_e2e_test.cc runs it as a
program; tests/python/test_client.py imports it).

    corrupting_proxy.py UPSTREAM_HOST:PORT TIMES NEEDLE_HEX [NEEDLE_HEX...]

prints "listening <port>" once it accepts, then "corrupted <n>" after each byte it flips.
Plaintext only (a test cluster on loopback). Thread-safety: one thread per direction per
connection; the count of flips is shared under a lock."""

import socket
import sys
import threading


class CorruptingProxy:
    def __init__(self, upstream, needles, times, on_corrupt=None):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.needles = [bytes(n) for n in needles]
        self.times = times
        self.corrupted = 0
        self.on_corrupt = on_corrupt
        self.lock = threading.Lock()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in [self.listener, *sockets]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source, sink, corrupt):
        # The last bytes of the previous read, so that a needle split across reads is found.
        tail = b""
        keep = max(len(n) for n in self.needles) - 1
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    sink.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            if corrupt:
                data = self._corrupt(tail, data)
                tail = (tail + data)[-keep:] if keep else b""
            try:
                sink.sendall(data)
            except OSError:
                return

    def _corrupt(self, tail, data):
        window = tail + data
        out = bytearray(data)
        for needle in self.needles:
            start = window.find(needle)
            while start >= 0:
                last = start + len(needle) - 1 - len(tail)  # the needle's last byte, in `data`
                if last >= 0:
                    with self.lock:
                        if self.corrupted >= self.times:
                            return bytes(out)
                        self.corrupted += 1
                        n = self.corrupted
                    out[last] ^= 0xFF
                    if self.on_corrupt:
                        self.on_corrupt(n)
                start = window.find(needle, start + 1)
        return bytes(out)


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    report = lambda n: print(f"corrupted {n}", flush=True)  # noqa: E731
    proxy = CorruptingProxy(argv[1], [bytes.fromhex(h) for h in argv[3:]], int(argv[2]), report)
    print(f"listening {proxy.port}", flush=True)
    threading.Event().wait()  # until the test kills this process
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
