// The ZMQ PULL connection resource (see zmq_connection.h).

#include "zmq_connection.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/errors.h"

namespace feedbench {
namespace {

namespace errors = tensorflow::errors;

// A blocked pull wakes up this often to see whether its step was cancelled
// or the connection is closing. Polling returns at once when data is ready,
// so this costs nothing while messages flow.
constexpr int64_t kSliceMs = 50;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string ZmqError() { return zmq_strerror(zmq_errno()); }

absl::Status SetIntOption(void* socket, int option, int value, const char* name, const std::string& ep) {
  if (zmq_setsockopt(socket, option, &value, sizeof(value)) != 0) {
    return errors::InvalidArgument("ZMQ endpoint ", ep, ": cannot set ", name, "=", value, ": ", ZmqError());
  }
  return absl::OkStatus();
}

}  // namespace

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

void Message::Decode() {
  const std::vector<wire::Frame> frames = Frames();
  ok_ = wire::DecodeMessage(frames, total_frames_, &native_, &header_, &tensors_, &error_);
}

ZmqConnection::ZmqConnection(const ConnectionOptions& options) : options_(options) {}

absl::Status ZmqConnection::Create(const ConnectionOptions& options, ZmqConnection** out) {
  *out = nullptr;
  auto* conn = new ZmqConnection(options);
  absl::Status s = conn->Open();
  if (!s.ok()) {
    conn->Unref();  // a ref-counted resource is released, never deleted
    return s;
  }
  *out = conn;
  return absl::OkStatus();
}

absl::Status ZmqConnection::Open() {
  const std::string& ep = options_.end_point;
  if (options_.hwm < 1) return errors::InvalidArgument("ZMQ endpoint ", ep, ": hwm must be >= 1, got ", options_.hwm);
  if (options_.num_threads < 1) return errors::InvalidArgument("num_threads must be >= 1");
  context_ = zmq_ctx_new();
  if (context_ == nullptr) return errors::Internal("cannot create a ZMQ context: ", ZmqError());
  socket_ = zmq_socket(context_, ZMQ_PULL);
  if (socket_ == nullptr) return errors::Internal("cannot create a ZMQ PULL socket: ", ZmqError());

  TF_RETURN_IF_ERROR(SetIntOption(socket_, ZMQ_RCVHWM, options_.hwm, "hwm", ep));
  TF_RETURN_IF_ERROR(SetIntOption(socket_, ZMQ_LINGER, 0, "linger", ep));
  // Large kernel buffers keep a fast producer streaming while we copy.
  TF_RETURN_IF_ERROR(SetIntOption(socket_, ZMQ_RCVBUF, 4 << 20, "rcvbuf", ep));
  const int64_t max_size = options_.max_msg_size < 0 ? -1 : options_.max_msg_size;
  if (zmq_setsockopt(socket_, ZMQ_MAXMSGSIZE, &max_size, sizeof(max_size)) != 0) {
    return errors::InvalidArgument("ZMQ endpoint ", ep, ": cannot set max_msg_size=", max_size, ": ", ZmqError());
  }

  const int rc = options_.bind ? zmq_bind(socket_, ep.c_str()) : zmq_connect(socket_, ep.c_str());
  if (rc != 0) {
    return errors::InvalidArgument("ZMQ endpoint ", ep, ": cannot ", options_.bind ? "bind" : "connect", ": ",
                                   ZmqError());
  }
  pool_ = std::make_unique<tensorflow::thread::ThreadPool>(tensorflow::Env::Default(), "zmq_pull",
                                                           options_.num_threads);
  return absl::OkStatus();
}

ZmqConnection::~ZmqConnection() {
  // Receives in flight see closing_ within one slice and return Cancelled;
  // destroying the pool waits for them (and runs any still queued), so no
  // receive thread touches the socket after this point.
  closing_.store(true);
  pool_.reset();
  if (socket_ != nullptr) zmq_close(socket_);
  if (context_ != nullptr) zmq_ctx_term(context_);
}

void ZmqConnection::CountMessage(size_t bytes) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  messages_ += 1;
  bytes_ += static_cast<int64_t>(bytes);
}

void ZmqConnection::Account(uint32_t producer_id, uint64_t seq, size_t bytes) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  messages_ += 1;
  bytes_ += static_cast<int64_t>(bytes);
  ProducerCount& c = producers_[producer_id];
  c.received += 1;
  if (seq == c.next_seq) {
    // in order
  } else if (seq > c.next_seq) {
    c.lost += static_cast<int64_t>(seq - c.next_seq);
  } else if (seq == 0) {
    c.restarts += 1;
  } else {
    c.duplicated += 1;
    return;
  }
  c.next_seq = seq + 1;
}

std::map<uint32_t, ZmqConnection::ProducerCount> ZmqConnection::ProducerCounts() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return producers_;
}

void ZmqConnection::Totals(int64_t* messages, int64_t* bytes) const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  *messages = messages_;
  *bytes = bytes_;
}

std::string ZmqConnection::DebugString() const {
  return "ZMQConnection(" + options_.end_point + (options_.bind ? ", bind" : ", connect") + ")";
}

absl::Status ZmqConnection::StopReason(tensorflow::CancellationManager* cancel, int64_t deadline_ms) const {
  if (closing_.load()) return errors::Cancelled("ZMQ connection ", options_.end_point, " was closed");
  if (cancel != nullptr && cancel->IsCancelled()) {
    return errors::Cancelled("pull from ", options_.end_point, " was cancelled");
  }
  if (deadline_ms >= 0 && NowMs() >= deadline_ms) {
    return errors::DeadlineExceeded("no message from ZMQ endpoint ", options_.end_point, " within ",
                                    options_.timeout_ms, " ms (timeout_ms)");
  }
  return absl::OkStatus();
}

absl::Status ZmqConnection::Receive(Message* msg, tensorflow::CancellationManager* cancel) {
  const int64_t deadline_ms = options_.timeout_ms < 0 ? -1 : NowMs() + options_.timeout_ms;

  // Another pull may be waiting on the socket; queue behind it, but keep
  // honouring our own deadline and cancellation while we wait.
  while (!socket_mu_.try_lock_for(std::chrono::milliseconds(kSliceMs))) {
    TF_RETURN_IF_ERROR(StopReason(cancel, deadline_ms));
  }
  std::lock_guard<std::timed_mutex> lock(socket_mu_, std::adopt_lock);

  while (true) {
    TF_RETURN_IF_ERROR(StopReason(cancel, deadline_ms));
    int64_t wait_ms = kSliceMs;
    if (deadline_ms >= 0) wait_ms = std::max<int64_t>(0, std::min(wait_ms, deadline_ms - NowMs()));
    zmq_pollitem_t item = {socket_, 0, ZMQ_POLLIN, 0};
    const int ready = zmq_poll(&item, 1, static_cast<long>(wait_ms));
    if (ready < 0) {
      if (zmq_errno() == EINTR) continue;
      if (zmq_errno() == ETERM) return errors::Cancelled("ZMQ connection ", options_.end_point, " was closed");
      return errors::Internal("zmq_poll on ", options_.end_point, ": ", ZmqError());
    }
    if (ready == 0 || !(item.revents & ZMQ_POLLIN)) continue;
    absl::Status s = TakeMessage(msg);
    if (s.ok()) {
      // Still under the lock, so two pulls cannot count their messages in
      // the opposite order from the one they arrived in.
      msg->Decode();
      if (msg->ok() && msg->native()) {
        Account(msg->header().producer_id, msg->header().seq, msg->total_bytes());
      } else if (msg->ok()) {
        CountMessage(msg->total_bytes());
      }
      return s;
    }
    if (!absl::IsUnavailable(s)) return s;
    // Unavailable: the socket was readable but the message vanished
    // (cannot happen with PULL, but costs nothing to handle): wait again.
  }
}

absl::Status ZmqConnection::TakeMessage(Message* msg) {
  // ZMQ delivers multipart messages atomically: once the first frame can be
  // read, all of them can, so only the first receive may say EAGAIN.
  while (true) {
    auto part = std::make_unique<zmq_msg_t>();
    zmq_msg_init(part.get());
    if (zmq_msg_recv(part.get(), socket_, ZMQ_DONTWAIT) < 0) {
      const int e = zmq_errno();
      zmq_msg_close(part.get());
      if (e == EINTR) continue;
      if (e == EAGAIN && msg->total_frames_ == 0) return errors::Unavailable("no message ready");
      return errors::Internal("receiving from ZMQ endpoint ", options_.end_point, ": ", zmq_strerror(e));
    }
    msg->total_frames_ += 1;
    msg->total_bytes_ += zmq_msg_size(part.get());
    const bool more = zmq_msg_more(part.get());
    if (msg->msgs_.size() < Message::kKeptFrames) {
      msg->msgs_.push_back(std::move(part));  // closed by ~Message
    } else {
      zmq_msg_close(part.get());
    }
    if (!more) return absl::OkStatus();
  }
}

}  // namespace feedbench
