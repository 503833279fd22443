// The TF-free receive core (see zmq_core.h).

#include "zmq_core.h"

#include <dirent.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace feedbench {
namespace core {
namespace {

// A blocked receive wakes up this often to see whether it was cancelled or
// the connection is closing. Polling returns at once when data is ready, so
// this costs nothing while messages flow.
constexpr int64_t kSliceMs = 50;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ZmqError() { return zmq_strerror(zmq_errno()); }

Status Error(Code code, std::string message) { return Status{code, std::move(message)}; }

// ZMQ's I/O threads read the sockets' bytes; one thread reads about 2 GB/s of large messages, below what
// eight producers send on a 16-core machine. Each producer's connection is served by one I/O thread, so
// several threads read several producers at once: one per 4 cores the process may use, 1 to 4.
// FEEDBENCH_ZMQ_IO_THREADS overrides, by consumers/zmq_pull.py:io_threads's rule for pyzmq: unset or empty
// gives the default; else ASCII decimal digits only (no sign, space or other script's digits), 1 to 64.
constexpr int kMaxIoThreads = 64;

Status IoThreads(int* n) {
  const char* env = std::getenv("FEEDBENCH_ZMQ_IO_THREADS");
  if (env != nullptr && *env != '\0') {
    const std::string text(env);
    const bool digits = text.size() <= 9 && std::all_of(text.begin(), text.end(), [](char c) {
                          return c >= '0' && c <= '9';
                        });
    const long value = digits ? std::stol(text) : 0;
    if (value < 1 || value > kMaxIoThreads) {
      std::string shown;
      for (unsigned char c : text.substr(0, 40)) shown += (c >= ' ' && c != 0x7f) ? static_cast<char>(c) : '?';
      return Error(Code::kInvalidArgument, "FEEDBENCH_ZMQ_IO_THREADS='" + shown +
                                               "' is not a whole number from 1 to " + std::to_string(kMaxIoThreads) +
                                               " (ZMQ I/O threads per consumer; unset, one per 4 cores)");
    }
    *n = static_cast<int>(value);
    return Status::Ok();
  }
  cpu_set_t set;
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  *n = std::min(4, std::max(1, cores / 4));
  return Status::Ok();
}

Status SetIntOption(void* socket, int option, int value, const char* name, const std::string& ep) {
  if (zmq_setsockopt(socket, option, &value, sizeof(value)) != 0) {
    return Error(Code::kInvalidArgument,
                 "ZMQ endpoint " + ep + ": cannot set " + name + "=" + std::to_string(value) + ": " + ZmqError());
  }
  return Status::Ok();
}

// The value of `key = "..."` in a pyzmq certificate file, or "".
std::string CertValue(const std::string& text, const std::string& key) {
  size_t at = text.find(key);
  while (at != std::string::npos) {
    size_t q1 = text.find('"', at);
    size_t eol = text.find('\n', at);
    if (q1 != std::string::npos && (eol == std::string::npos || q1 < eol)) {
      size_t q2 = text.find('"', q1 + 1);
      if (q2 != std::string::npos) return text.substr(q1 + 1, q2 - q1 - 1);
    }
    at = text.find(key, at + 1);
  }
  return "";
}

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}

std::string MakeKeysHint(const std::string& dir) {
  return " (make the keys with `python -m producers make-keys " + dir + "`)";
}

bool ValidZ85Key(const std::string& z85) {
  uint8_t buf[32];
  return z85.size() == 40 && zmq_z85_decode(buf, z85.c_str()) != nullptr;
}

// True when a live socket accepts connections at `path` (a stale socket file
// refuses them). libzmq would unlink a live socket's file and bind over it,
// leaving the consumer already there waiting for batches that never come.
bool IpcServed(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool served = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return served;
}

// ZMQ_EVENT_HANDSHAKE_FAILED_* (libzmq >= 4.3).
constexpr int kHandshakeNoDetail = 0x0800;
constexpr int kHandshakeProtocol = 0x2000;
constexpr int kHandshakeAuth = 0x4000;

}  // namespace

// ------------------------------------------------------------- accounting

void SeqTracker::Add(uint32_t producer_id, uint64_t seq) {
  ProducerCount& c = producers_[producer_id];
  c.received += 1;
  if (!c.joined) {
    // where this consumer joined the stream: earlier batches went elsewhere
    c.joined = true;
    c.joined_at = seq;
  } else if (seq == c.next_seq) {
    // in order
  } else if (seq > c.next_seq) {
    // a gap of up to 2^64 - 1 from a hostile peer: the count saturates instead of overflowing
    const uint64_t gap = seq - c.next_seq;
    const uint64_t room = static_cast<uint64_t>(INT64_MAX - c.lost);
    c.lost = gap > room ? INT64_MAX : c.lost + static_cast<int64_t>(gap);
  } else if (seq == 0) {
    c.restarts += 1;
  } else {
    c.duplicated += 1;
    return;
  }
  c.next_seq = seq + 1;
}

// ------------------------------------------------------------- keys

Status LoadCurveKey(const std::string& dir, const std::string& name, bool secret, std::string* public_z85,
                    std::string* secret_z85) {
  const std::string file = name + (secret ? ".key_secret" : ".key");
  std::string text;
  if (!ReadFile(dir + "/" + file, &text)) {
    return Error(Code::kInvalidArgument, "--curve-keys " + dir + ": " + file + " is missing" + MakeKeysHint(dir));
  }
  *public_z85 = CertValue(text, "public-key");
  if (!ValidZ85Key(*public_z85)) {
    return Error(Code::kInvalidArgument, "--curve-keys " + dir + ": " + file + " is not a valid key file");
  }
  if (secret) {
    *secret_z85 = CertValue(text, "secret-key");
    if (!ValidZ85Key(*secret_z85)) {
      return Error(Code::kInvalidArgument,
                   "--curve-keys " + dir + ": " + file + " has no valid secret key" + MakeKeysHint(dir));
    }
  }
  return Status::Ok();
}

Status LoadClientKeys(const std::string& dir, std::vector<std::string>* binary_keys) {
  // Like pyzmq's ThreadAuthenticator.configure_curve(location=dir): every
  // public key in the folder's *.key files is admitted.
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    return Error(Code::kInvalidArgument, "--curve-keys " + dir + ": cannot open the folder: " + strerror(errno));
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".key") == 0) names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    std::string text;
    if (!ReadFile(dir + "/" + n, &text)) continue;
    const std::string z85 = CertValue(text, "public-key");
    uint8_t key[32];
    if (z85.size() != 40 || zmq_z85_decode(key, z85.c_str()) == nullptr) {
      return Error(Code::kInvalidArgument, "--curve-keys " + dir + ": " + n + " is not a valid key file");
    }
    binary_keys->emplace_back(reinterpret_cast<const char*>(key), 32);
  }
  if (binary_keys->empty()) {
    return Error(Code::kInvalidArgument, "--curve-keys " + dir + ": no client public keys (*.key)" + MakeKeysHint(dir));
  }
  return Status::Ok();
}

// ------------------------------------------------------------- messages

Message::~Message() {
  for (auto& m : msgs_) zmq_msg_close(m.get());
}

std::vector<wire::Frame> Message::Frames() const {
  std::vector<wire::Frame> frames;
  frames.reserve(msgs_.size());
  for (const auto& m : msgs_) {
    frames.push_back({static_cast<const char*>(zmq_msg_data(m.get())), zmq_msg_size(m.get())});
  }
  return frames;
}

void Message::Clear() {
  for (auto& m : msgs_) zmq_msg_close(m.get());
  msgs_.clear();
  total_frames_ = total_bytes_ = 0;
  ok_ = native_ = slot_message_ = false;
  slot_ = shm::SlotRef();
  header_ = wire::NativeHeader();
  tensors_.clear();
  error_ = wire::WireError();
}

void Message::Decode() {
  const std::vector<wire::Frame> frames = Frames();
  if (shm::IsSlotMessage(frames)) {
    slot_message_ = native_ = true;
    ok_ = shm::DecodeSlotMessage(frames, total_frames_, &header_, &tensors_, &slot_, &error_);
    return;
  }
  ok_ = wire::DecodeMessage(frames, total_frames_, &native_, &header_, &tensors_, &error_);
}

size_t Message::payload_bytes() const {
  if (!slot_message_) return total_bytes_;
  size_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

// ------------------------------------------------------------- connection

Connection::Connection(const ConnectionOptions& options) : options_(options) {}

Connection::~Connection() {
  closing_.store(true);
  // The monitor goes off while the auth thread still reads its events: a handshake failing after that
  // thread ended would block libzmq's I/O thread on the event's send, holding the lock this call needs.
  if (socket_ != nullptr && !options_.curve_keys_dir.empty()) zmq_socket_monitor(socket_, nullptr, 0);
  auth_stop_.store(true);
  if (auth_thread_.joinable()) auth_thread_.join();  // it closes zap_ and monitor_
  if (socket_ != nullptr) zmq_close(socket_);
  if (zap_ != nullptr) zmq_close(zap_);
  if (monitor_ != nullptr) zmq_close(monitor_);
  if (context_ != nullptr) zmq_ctx_term(context_);
  // libzmq leaves a bound ipc socket's file behind: remove it, unless another consumer has bound the
  // path since (a live socket there accepts connections).
  if (!bound_file_.empty() && !IpcServed(bound_file_)) unlink(bound_file_.c_str());
}

std::string Connection::DebugString() const {
  return "ZMQConnection(" + options_.end_point + (options_.bind ? ", bind" : ", connect") + ")";
}

Status Connection::Open() {
  const std::string& ep = options_.end_point;
  if (options_.hwm < 1) {
    return Error(Code::kInvalidArgument, "ZMQ endpoint " + ep + ": hwm must be >= 1, got " +
                                             std::to_string(options_.hwm));
  }
  int io_threads = 1;
  FB_RETURN_IF_ERROR(IoThreads(&io_threads));
  context_ = zmq_ctx_new();
  if (context_ == nullptr) return Error(Code::kInternal, "cannot create a ZMQ context: " + ZmqError());
  zmq_ctx_set(context_, ZMQ_IO_THREADS, io_threads);  // before the first socket: it starts them
  socket_ = zmq_socket(context_, ZMQ_PULL);
  if (socket_ == nullptr) return Error(Code::kInternal, "cannot create a ZMQ PULL socket: " + ZmqError());

  FB_RETURN_IF_ERROR(SetIntOption(socket_, ZMQ_RCVHWM, options_.hwm, "hwm", ep));
  FB_RETURN_IF_ERROR(SetIntOption(socket_, ZMQ_LINGER, 0, "linger", ep));
  // Large kernel buffers keep a fast producer streaming while we copy.
  FB_RETURN_IF_ERROR(SetIntOption(socket_, ZMQ_RCVBUF, 4 << 20, "rcvbuf", ep));
  const int64_t max_size = options_.max_msg_size < 0 ? -1 : options_.max_msg_size;
  if (zmq_setsockopt(socket_, ZMQ_MAXMSGSIZE, &max_size, sizeof(max_size)) != 0) {
    return Error(Code::kInvalidArgument, "ZMQ endpoint " + ep + ": cannot set max_msg_size=" +
                                             std::to_string(max_size) + ": " + ZmqError());
  }
  if (!options_.curve_keys_dir.empty()) FB_RETURN_IF_ERROR(OpenCurve());

  std::string zmq_ep = ep;
  if (shm::IsShmEndpoint(ep)) {
    std::string why;
    if (!shm::ZmqEndpoint(ep, &zmq_ep, &why)) return Error(Code::kInvalidArgument, why);
    // Producers hand their regions over before their first slot message: listen first.
    if (!slots_.Listen(ep, &why)) return Error(Code::kInvalidArgument, why);
    // Abstract address: admit only this user's processes (ignored by a libzmq
    // built without it; the region hand-over checks the user either way).
#ifndef ZMQ_IPC_FILTER_UID
#define ZMQ_IPC_FILTER_UID 59  // deprecated in zmq.h, still in libzmq 4.3; absent from some headers
#endif
    const int uid = static_cast<int>(getuid());
    zmq_setsockopt(socket_, ZMQ_IPC_FILTER_UID, &uid, sizeof(uid));
  }
  // Two consumers on one ipc path (or shm:// NAME): refuse the second, as TCP does.
  if (options_.bind && zmq_ep.rfind("ipc://", 0) == 0 && zmq_ep.size() > 6 && zmq_ep[6] != '@' &&
      IpcServed(zmq_ep.substr(6))) {
    return Error(Code::kInvalidArgument, "ZMQ endpoint " + ep + ": cannot bind: address already in use");
  }
  const int rc = options_.bind ? zmq_bind(socket_, zmq_ep.c_str()) : zmq_connect(socket_, zmq_ep.c_str());
  if (rc != 0) {
    return Error(Code::kInvalidArgument,
                 "ZMQ endpoint " + ep + ": cannot " + (options_.bind ? "bind" : "connect") + ": " + ZmqError());
  }
  if (options_.bind && zmq_ep.rfind("ipc://", 0) == 0 && zmq_ep.size() > 6 && zmq_ep[6] != '@') {
    bound_file_ = zmq_ep.substr(6);
  }
  return Status::Ok();
}

Status Connection::OpenCurve() {
  const std::string& dir = options_.curve_keys_dir;
  const std::string& ep = options_.end_point;
  if (!zmq_has("curve")) {
    return Error(Code::kInvalidArgument, "--curve-keys: this libzmq was built without CURVE (libsodium)");
  }
  std::string pub, sec;
  if (!options_.bind) {  // client: our pair, and the server's public key
    FB_RETURN_IF_ERROR(LoadCurveKey(dir, "client", true, &pub, &sec));
    std::string server_pub, unused;
    FB_RETURN_IF_ERROR(LoadCurveKey(dir, "server", false, &server_pub, &unused));
    if (zmq_setsockopt(socket_, ZMQ_CURVE_SERVERKEY, server_pub.c_str(), 41) != 0 ||
        zmq_setsockopt(socket_, ZMQ_CURVE_PUBLICKEY, pub.c_str(), 41) != 0 ||
        zmq_setsockopt(socket_, ZMQ_CURVE_SECRETKEY, sec.c_str(), 41) != 0) {
      return Error(Code::kInvalidArgument, "ZMQ endpoint " + ep + ": cannot set the CURVE keys: " + ZmqError());
    }
    return Status::Ok();
  }
  FB_RETURN_IF_ERROR(LoadCurveKey(dir, "server", true, &pub, &sec));
  FB_RETURN_IF_ERROR(LoadClientKeys(dir, &client_keys_));

  // The ZAP handler must be bound before the socket accepts a peer; with one
  // bound, libzmq asks it about every CURVE client (RFC 27).
  zap_ = zmq_socket(context_, ZMQ_REP);
  if (zap_ == nullptr || zmq_bind(zap_, "inproc://zeromq.zap.01") != 0) {
    return Error(Code::kInternal, "cannot start the CURVE authenticator: " + ZmqError());
  }
  const std::string monitor_ep = "inproc://feedbench-handshakes";
  if (zmq_socket_monitor(socket_, monitor_ep.c_str(), kHandshakeNoDetail | kHandshakeProtocol | kHandshakeAuth) !=
      0) {
    return Error(Code::kInternal, "cannot monitor CURVE handshakes: " + ZmqError());
  }
  monitor_ = zmq_socket(context_, ZMQ_PAIR);
  if (monitor_ == nullptr || zmq_connect(monitor_, monitor_ep.c_str()) != 0) {
    return Error(Code::kInternal, "cannot monitor CURVE handshakes: " + ZmqError());
  }
  const int one = 1;
  if (zmq_setsockopt(socket_, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
      zmq_setsockopt(socket_, ZMQ_CURVE_SECRETKEY, sec.c_str(), 41) != 0 ||
      zmq_setsockopt(socket_, ZMQ_CURVE_PUBLICKEY, pub.c_str(), 41) != 0 ||
      zmq_setsockopt(socket_, ZMQ_ZAP_DOMAIN, "feedbench", 9) != 0) {
    return Error(Code::kInvalidArgument, "ZMQ endpoint " + ep + ": cannot set the CURVE keys: " + ZmqError());
  }
  auth_thread_ = std::thread([this] { AuthLoop(); });
  return Status::Ok();
}

namespace {

// All frames of one message on `sock` (which is ready), as strings.
std::vector<std::string> RecvAll(void* sock) {
  std::vector<std::string> parts;
  while (true) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      break;
    }
    parts.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
    const bool more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    if (!more) break;
  }
  return parts;
}

}  // namespace

void Connection::AuthLoop() {
  while (!auth_stop_.load()) {
    zmq_pollitem_t items[2] = {{zap_, 0, ZMQ_POLLIN, 0}, {monitor_, 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 2, kSliceMs) <= 0) continue;
    if (items[0].revents & ZMQ_POLLIN) {
      // ZAP request: version, request id, domain, address, identity,
      // mechanism, credentials (the client's 32-byte public key for CURVE).
      std::vector<std::string> req = RecvAll(zap_);
      const bool well_formed = req.size() >= 6 && req[0] == "1.0";
      bool allowed = false;
      if (well_formed && req[5] == "CURVE" && req.size() >= 7) {
        allowed = std::find(client_keys_.begin(), client_keys_.end(), req[6]) != client_keys_.end();
      }
      const std::string id = req.size() > 1 ? req[1] : "";
      const std::string code = allowed ? "200" : "400";
      const std::string text = allowed ? "OK" : "client key not in the --curve-keys folder";
      const std::string reply[6] = {"1.0", id, code, text, "", ""};
      for (int i = 0; i < 6; ++i) zmq_send(zap_, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
      if (!allowed) {
        std::lock_guard<std::mutex> lock(auth_mu_);
        const std::string addr = req.size() > 3 ? req[3] : "?";
        auth_reason_ = "a producer at " + addr + " offered a client key that is not in " +
                       options_.curve_keys_dir;
      }
    }
    if (items[1].revents & ZMQ_POLLIN) {
      std::vector<std::string> ev = RecvAll(monitor_);
      if (!ev.empty() && ev[0].size() >= 6) {
        uint16_t event;
        std::memcpy(&event, ev[0].data(), 2);
        std::lock_guard<std::mutex> lock(auth_mu_);
        auth_failures_ += 1;
        if (event != kHandshakeAuth || auth_reason_.empty()) {
          auth_reason_ = event == kHandshakeAuth
                             ? "a producer's client key was refused"
                             : "a producer failed the CURVE handshake (no keys, or another server key)";
        }
      }
    }
  }
  zmq_close(zap_);
  zap_ = nullptr;
  zmq_close(monitor_);
  monitor_ = nullptr;
}

std::string Connection::AuthFailures() const {
  std::lock_guard<std::mutex> lock(auth_mu_);
  if (auth_failures_ == 0) return "";
  return std::to_string(auth_failures_) + " connection attempt(s) refused by CURVE authentication; last: " +
         auth_reason_;
}

void Connection::Account(const Message& msg) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  messages_ += 1;
  // A slot message's bytes are counted once its slot is read (ResolveSlot): its header may declare any size.
  if (!msg.slot_message()) AddBytesLocked(msg.payload_bytes());
  if (msg.native()) tracker_.Add(msg.header().producer_id, msg.header().seq);
}

void Connection::AddBytesLocked(uint64_t add) {
  // Saturates rather than overflow: a long run's total stays a count.
  bytes_ = add > static_cast<uint64_t>(INT64_MAX - bytes_) ? INT64_MAX : bytes_ + static_cast<int64_t>(add);
}

bool Connection::ResolveSlot(const Message& msg, std::vector<wire::TensorView>* tensors, shm::SlotLease* lease,
                             wire::WireError* err) {
  if (!msg.slot_message()) return true;
  if (!slots_.Resolve(msg.slot(), tensors, lease, err)) return false;
  std::lock_guard<std::mutex> lock(stats_mu_);
  AddBytesLocked(msg.payload_bytes());
  return true;
}

std::map<uint32_t, ProducerCount> Connection::ProducerCounts() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return tracker_.counts();
}

void Connection::Totals(int64_t* messages, int64_t* bytes) const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  *messages = messages_;
  *bytes = bytes_;
}

Status Connection::StopReason(const std::function<bool()>& cancelled, int64_t deadline_ms,
                              int64_t timeout_ms) const {
  if (closing_.load()) return Error(Code::kCancelled, "ZMQ connection " + options_.end_point + " was closed");
  if (cancelled && cancelled()) {
    return Error(Code::kCancelled, "pull from " + options_.end_point + " was cancelled");
  }
  if (deadline_ms >= 0 && NowMs() >= deadline_ms) {
    std::string msg = "no message from ZMQ endpoint " + options_.end_point + " within " +
                      std::to_string(timeout_ms) + " ms (timeout_ms)";
    const std::string auth = AuthFailures();
    if (!auth.empty()) msg += "; " + auth;
    return Error(Code::kDeadlineExceeded, msg);
  }
  return Status::Ok();
}

Status Connection::Receive(Message* msg, const std::function<bool()>& cancelled, int64_t timeout_ms) {
  if (timeout_ms < -1) timeout_ms = options_.timeout_ms;
  const int64_t deadline_ms = timeout_ms < 0 ? -1 : NowMs() + timeout_ms;

  // Another receive may be waiting on the socket; queue behind it, but keep
  // honouring our own deadline and cancellation while we wait.
  while (!socket_mu_.try_lock_for(std::chrono::milliseconds(kSliceMs))) {
    FB_RETURN_IF_ERROR(StopReason(cancelled, deadline_ms, timeout_ms));
  }
  std::lock_guard<std::timed_mutex> lock(socket_mu_, std::adopt_lock);

  int64_t starved_since = -1;
  const bool shm = shm::IsShmEndpoint(options_.end_point);
  while (true) {
    FB_RETURN_IF_ERROR(StopReason(cancelled, deadline_ms, timeout_ms));
    if (shm) slots_.Poll();  // other users' connections to the hand-over socket are closed as they come
    uint32_t held = 0;
    if (slots_.AllTaken(&held)) {
      if (starved_since < 0) starved_since = NowMs();
      if (NowMs() - starved_since >= kStarvedMs) {
        return Error(Code::kResourceExhausted,
                     "shm: this consumer has held all " + std::to_string(held) + " slots of its producers' regions on " +
                         options_.end_point + " for " + std::to_string(kStarvedMs / 1000) +
                         " s, so no producer can send: tensors over slots are kept too long (prefetch or staging "
                         "deeper than the ring); give producers more slots (--shm-slots) or turn zero-copy off");
      }
    } else {
      starved_since = -1;
    }
    int64_t wait_ms = kSliceMs;
    if (deadline_ms >= 0) wait_ms = std::max<int64_t>(0, std::min(wait_ms, deadline_ms - NowMs()));
    zmq_pollitem_t item = {socket_, 0, ZMQ_POLLIN, 0};
    const int ready = zmq_poll(&item, 1, static_cast<long>(wait_ms));
    if (ready < 0) {
      if (zmq_errno() == EINTR) continue;
      if (zmq_errno() == ETERM) return Error(Code::kCancelled, "ZMQ connection " + options_.end_point + " was closed");
      return Error(Code::kInternal, "zmq_poll on " + options_.end_point + ": " + ZmqError());
    }
    if (ready == 0 || !(item.revents & ZMQ_POLLIN)) continue;
    Status s = TakeMessage(msg);
    if (s.ok()) {
      // Still under the lock, so two receives cannot count their messages in
      // the opposite order from the one they arrived in.
      msg->Decode();
      if (msg->ok() && msg->slot_message() && slots_.Retired(msg->slot().region)) {
        msg->Clear();  // its producer exited or moved on to a new region: that batch is gone
        continue;
      }
      if (msg->ok()) Account(*msg);
      return s;
    }
    if (s.code != Code::kUnavailable) return s;
    // Unavailable: the socket was readable but the message vanished
    // (cannot happen with PULL, but costs nothing to handle): wait again.
  }
}

Status Connection::TakeMessage(Message* msg) {
  // ZMQ delivers multipart messages atomically: once the first frame can be
  // read, all of them can, so only the first receive may say EAGAIN.
  while (true) {
    auto part = std::make_unique<zmq_msg_t>();
    zmq_msg_init(part.get());
    if (zmq_msg_recv(part.get(), socket_, ZMQ_DONTWAIT) < 0) {
      const int e = zmq_errno();
      zmq_msg_close(part.get());
      if (e == EINTR) continue;
      if (e == EAGAIN && msg->total_frames_ == 0) return Error(Code::kUnavailable, "no message ready");
      return Error(Code::kInternal, "receiving from ZMQ endpoint " + options_.end_point + ": " + zmq_strerror(e));
    }
    msg->total_frames_ += 1;
    msg->total_bytes_ += zmq_msg_size(part.get());
    const bool more = zmq_msg_more(part.get());
    if (msg->msgs_.size() < Message::kKeptFrames) {
      msg->msgs_.push_back(std::move(part));  // closed by ~Message
    } else {
      zmq_msg_close(part.get());
    }
    if (!more) return Status::Ok();
  }
}

}  // namespace core
}  // namespace feedbench
