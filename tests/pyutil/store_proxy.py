"""A TCP proxy in front of a store, for tests of what a client does when a
reply is lost or the store behind an address changes.

- drop_reply_once(pattern): the first request (on any connection) whose bytes
  contain `pattern` goes through to the store, which applies it; when the
  store's reply starts to come back, the proxy resets the client's
  connection (RST) and closes the store's, instead of passing the reply on.
  The client then sees a request that may or may not have been applied: the
  window at the end of every job that issue 40 found (a lost reply to the
  last node's success report).
- drop_request_once(pattern): the first request whose bytes contain
  `pattern` never reaches the store: the proxy resets the client's
  connection instead of passing it on (a request lost with its connection;
  for a SET, which has no reply, the client learns of it only at its next
  request).
- set_upstream(port): later connections go to another store (a store
  restarted empty on a new port); existing ones keep theirs and break when
  it goes.

Every other byte passes unchanged, both ways. A client is synchronous (one
request, then its reply), so "the reply to the request that matched" is the
first byte the store sends after it. Threads: one accepting, one per
connection pair; stop() ends them all."""
import selectors
import socket
import struct
import threading


class StoreProxy:
    def __init__(self, upstream_port, host="127.0.0.1"):
        self._host = host
        self._upstream = upstream_port
        self._lock = threading.Lock()
        self._pattern = None
        self._request_pattern = None
        self.dropped = threading.Event()  # set once a reply or a request was dropped
        self._conns = []
        self._stopping = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def drop_reply_once(self, pattern):
        with self._lock:
            self._pattern = pattern if isinstance(pattern, bytes) else pattern.encode()
            self.dropped.clear()

    def drop_request_once(self, pattern):
        with self._lock:
            self._request_pattern = pattern if isinstance(pattern, bytes) else pattern.encode()
            self.dropped.clear()

    def set_upstream(self, port):
        with self._lock:
            self._upstream = port

    def stop(self):
        self._stopping = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for s in conns:
            try:
                s.close()
            except OSError:
                pass
        for t in self._threads:
            t.join(10)

    # ------------------------------------------------------------ internals

    def _accept(self):
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                port = self._upstream
            try:
                upstream = socket.create_connection((self._host, port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._conns += [client, upstream]
            t = threading.Thread(target=self._pump, args=(client, upstream), daemon=True)
            self._threads.append(t)
            t.start()

    @staticmethod
    def _reset(sock):
        """Closes `sock` with an RST (SO_LINGER 0), as a network reset would."""
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        sock.close()

    def _claim(self, seen):
        """Whether `seen` (the client's recent bytes) holds the armed reply
        pattern; if so the pattern is used up (once, across connections)."""
        with self._lock:
            if self._pattern is None or self._pattern not in seen:
                return False
            self._pattern = None
            return True

    def _claim_request(self, seen):
        """As _claim, for the armed request pattern."""
        with self._lock:
            if self._request_pattern is None or self._request_pattern not in seen:
                return False
            self._request_pattern = None
            return True

    def _pump(self, client, upstream):
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        tail = b""  # the client's last bytes: a pattern split across reads
        armed = False  # a matching request went up; its reply must not come back
        try:
            while not self._stopping:
                for key, _ in sel.select(timeout=1.0):
                    src, dst = key.fileobj, key.data
                    try:
                        data = src.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        return
                    if src is client:
                        seen = tail + data
                        if self._claim_request(seen):
                            # Lost with its connection: the store never sees it.
                            self.dropped.set()
                            armed = True  # reset the client below
                            return
                        if not armed and self._claim(seen):
                            armed = True
                        tail = seen[-256:]
                    elif armed:
                        # The store answered the request that matched: lose it.
                        self.dropped.set()
                        return
                    dst.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            if armed:
                self._reset(client)
            else:
                client.close()
            upstream.close()
            with self._lock:
                for s in (client, upstream):
                    if s in self._conns:
                        self._conns.remove(s)
