/* Preloaded into a TensorFlow cluster task: its gRPC server listens only on the task's own address.
 *
 * TensorFlow's server has no bind-address option: gRPC binds the wildcard address ([::] or 0.0.0.0)
 * of the task's port, so the task would accept connections on every interface. This wraps bind():
 * a bind of the wildcard address on FEEDBENCH_BIND_PORT is made on FEEDBENCH_BIND_HOST (a numeric
 * address) instead. An IPv6 wildcard with an IPv4 host is refused with EAFNOSUPPORT, so gRPC goes on
 * to its IPv4 socket, which is then bound to the host. Every other bind() passes through unchanged.
 * Built by runner/bind_host.py.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static bind_fn real_bind(void) {
  static bind_fn fn = NULL;
  if (fn == NULL) fn = (bind_fn)dlsym(RTLD_NEXT, "bind");
  return fn;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  bind_fn real = real_bind();
  if (real == NULL) {
    errno = ENOSYS;
    return -1;
  }
  const char *host = getenv("FEEDBENCH_BIND_HOST");
  const char *port_text = getenv("FEEDBENCH_BIND_PORT");
  if (host == NULL || port_text == NULL || addr == NULL) return real(fd, addr, len);
  const int port = atoi(port_text);
  if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in in;
    memcpy(&in, addr, sizeof in);
    if (in.sin_addr.s_addr != htonl(INADDR_ANY) || ntohs(in.sin_port) != port) return real(fd, addr, len);
    if (inet_pton(AF_INET, host, &in.sin_addr) != 1) {
      errno = EADDRNOTAVAIL; /* an IPv6 host: it was bound on the IPv6 socket */
      return -1;
    }
    return real(fd, (const struct sockaddr *)&in, sizeof in);
  }
  if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 in6;
    memcpy(&in6, addr, sizeof in6);
    if (!IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr) || ntohs(in6.sin6_port) != port) return real(fd, addr, len);
    if (inet_pton(AF_INET6, host, &in6.sin6_addr) != 1) {
      errno = EAFNOSUPPORT; /* an IPv4 host: bind it on the IPv4 socket that comes next */
      return -1;
    }
    return real(fd, (const struct sockaddr *)&in6, sizeof in6);
  }
  return real(fd, addr, len);
}
