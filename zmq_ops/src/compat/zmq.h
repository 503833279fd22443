/* The part of libzmq's stable C API (4.x, zmq.h) that feedbench's receiver
 * uses, for building against the libzmq that the pyzmq wheel bundles on
 * machines without libzmq's development headers. Values and signatures are
 * those of libzmq's public header (MPL-2.0); zmq_ops/build.py uses the real
 * header instead whenever one is installed, and tests/test_receiver.py checks
 * these values against it. Linux (POSIX file descriptors) only. */
#ifndef FEEDBENCH_COMPAT_ZMQ_H_
#define FEEDBENCH_COMPAT_ZMQ_H_

#include <errno.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZMQ_HAUSNUMERO 156384712
#define EFSM (ZMQ_HAUSNUMERO + 51)
#define ETERM (ZMQ_HAUSNUMERO + 53)

#define ZMQ_PAIR 0
#define ZMQ_REP 4
#define ZMQ_PULL 7
#define ZMQ_PUSH 8

#define ZMQ_SNDBUF 11
#define ZMQ_RCVBUF 12
#define ZMQ_RCVMORE 13
#define ZMQ_LINGER 17
#define ZMQ_MAXMSGSIZE 22
#define ZMQ_SNDHWM 23
#define ZMQ_RCVHWM 24
#define ZMQ_IO_THREADS 1
#define ZMQ_RCVTIMEO 27
#define ZMQ_SNDTIMEO 28
#define ZMQ_IMMEDIATE 39
#define ZMQ_CURVE_SERVER 47
#define ZMQ_CURVE_PUBLICKEY 48
#define ZMQ_CURVE_SECRETKEY 49
#define ZMQ_CURVE_SERVERKEY 50
#define ZMQ_ZAP_DOMAIN 55

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2

#define ZMQ_EVENT_CONNECTED 0x0001
#define ZMQ_EVENT_ACCEPTED 0x0020
#define ZMQ_EVENT_DISCONNECTED 0x0200
#define ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL 0x0800
#define ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL 0x2000
#define ZMQ_EVENT_HANDSHAKE_FAILED_AUTH 0x4000

#define ZMQ_POLLIN 1
#define ZMQ_POLLOUT 2

typedef struct zmq_msg_t {
  unsigned char _[64] __attribute__((aligned(sizeof(void*))));
} zmq_msg_t;

typedef struct zmq_pollitem_t {
  void* socket;
  int fd;
  short events;
  short revents;
} zmq_pollitem_t;

int zmq_errno(void);
const char* zmq_strerror(int errnum);
int zmq_has(const char* capability);

void* zmq_ctx_new(void);
int zmq_ctx_set(void* context, int option, int optval);
int zmq_ctx_term(void* context);

void* zmq_socket(void* context, int type);
int zmq_close(void* s);
int zmq_setsockopt(void* s, int option, const void* optval, size_t optvallen);
int zmq_getsockopt(void* s, int option, void* optval, size_t* optvallen);
int zmq_bind(void* s, const char* addr);
int zmq_connect(void* s, const char* addr);
int zmq_send(void* s, const void* buf, size_t len, int flags);
int zmq_socket_monitor(void* s, const char* addr, int events);

int zmq_msg_init(zmq_msg_t* msg);
int zmq_msg_init_size(zmq_msg_t* msg, size_t size);
int zmq_msg_send(zmq_msg_t* msg, void* s, int flags);
int zmq_msg_recv(zmq_msg_t* msg, void* s, int flags);
int zmq_msg_close(zmq_msg_t* msg);
void* zmq_msg_data(zmq_msg_t* msg);
size_t zmq_msg_size(const zmq_msg_t* msg);
int zmq_msg_more(const zmq_msg_t* msg);

int zmq_poll(zmq_pollitem_t* items, int nitems, long timeout);

unsigned char* zmq_z85_decode(unsigned char* dest, const char* string);

#ifdef __cplusplus
}
#endif

#endif /* FEEDBENCH_COMPAT_ZMQ_H_ */
