// The CPU thread pool behind `parallel_for` (see parallel.h for the contract).
//
// 1. Each parallel call publishes a heap-allocated `Job` (body, chunk count, atomic claim and done
//    counters) under the pool mutex and bumps a generation number to wake the workers.
// 2. Workers copy the job's shared_ptr under the mutex, then claim chunks with fetch_add until the
//    counter passes the chunk count. A worker that wakes late holds an old, exhausted job and
//    never touches the caller's body: the claim counter lives in the job, not in the pool.
// 3. The caller claims chunks too, then sleeps until done == chunks; the worker finishing the
//    last chunk notifies it under the mutex (no lost wake-up).
#include "backend/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "splice/backend/cpu/primitives.h"
#include "splice/core/error.h"

namespace splice::cpu {
namespace {

constexpr const char* kThreadsEnv = "SPLICE_NUM_THREADS";

// True on pool workers always, and on a caller while it runs chunks: a nested parallel_for
// from such a thread runs inline.
thread_local bool t_inside_parallel = false;

struct Job {
  const ChunkFn* body = nullptr;
  std::int64_t begin = 0;
  std::int64_t count = 0;  // indices in the range
  std::int64_t chunks = 0;
  std::atomic<std::int64_t> next{0};  // next chunk to claim
  std::atomic<std::int64_t> done{0};  // chunks finished
  std::mutex error_mutex;
  std::exception_ptr error;

  // Runs chunks until none are left; returns true when this thread finished the last one.
  bool run_chunks() {
    bool finished_last = false;
    for (std::int64_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      const std::int64_t lo = begin + count * c / chunks;
      const std::int64_t hi = begin + count * (c + 1) / chunks;
      try {
        (*body)(lo, hi);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == chunks) finished_last = true;
    }
    return finished_last;
  }
};

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs the job on the workers and the caller; false (nothing run) when another thread is
  // already using the pool.
  bool try_run(const std::shared_ptr<Job>& job) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = job;
      ++generation_;
    }
    wake_.notify_all();
    t_inside_parallel = true;
    job->run_chunks();
    t_inside_parallel = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_.wait(lock, [&] { return job->done.load() == job->chunks; });
      job_.reset();
    }
    return true;
  }

 private:
  void worker_loop() {
    t_inside_parallel = true;
    std::uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      if (job && job->run_chunks()) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_all();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;      // guards job_, generation_, stop_; pairs with wake_ and done_
  std::condition_variable wake_;
  std::condition_variable done_;
  std::shared_ptr<Job> job_;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

std::mutex g_config_mutex;
int g_num_threads = 0;  // 0: not read yet
std::unique_ptr<ThreadPool> g_pool;

int default_threads() {
  if (const char* env = std::getenv(kThreadsEnv); env && *env) {
    char* end = nullptr;
    const long value = std::strtol(env, &end, 10);
    if (*end != '\0' || value < 1 || value > 4096)
      fail<ValueError>("`", kThreadsEnv, "` must be a positive integer, got '", env, "'");
    return static_cast<int>(value);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

int threads_locked() {
  if (g_num_threads == 0) g_num_threads = default_threads();
  return g_num_threads;
}

}  // namespace

int num_threads() {
  std::lock_guard<std::mutex> lock(g_config_mutex);
  return threads_locked();
}

void set_num_threads(int n) {
  if (n < 1) fail<ValueError>("`num_threads` must be >= 1, got ", n);
  std::lock_guard<std::mutex> lock(g_config_mutex);
  g_pool.reset();  // joins the old workers
  g_num_threads = n;
}

std::int64_t parallel_chunks(std::int64_t begin, std::int64_t end, std::int64_t grain) {
  const std::int64_t count = end - begin;
  if (count <= 0) return 0;
  if (t_inside_parallel) return 1;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t by_grain = (count + grain - 1) / grain;
  return std::min<std::int64_t>(by_grain, num_threads());
}

void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, const ChunkFn& fn) {
  const std::int64_t chunks = parallel_chunks(begin, end, grain);
  if (chunks == 0) return;
  if (chunks == 1) {
    fn(begin, end);
    return;
  }
  auto job = std::make_shared<Job>();
  job->body = &fn;
  job->begin = begin;
  job->count = end - begin;
  job->chunks = chunks;
  ThreadPool* pool = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_config_mutex);
    if (!g_pool) g_pool = std::make_unique<ThreadPool>(threads_locked());
    pool = g_pool.get();
  }
  if (!pool->try_run(job)) {
    // Another thread owns the pool: run every chunk here, in order, with the same split.
    t_inside_parallel = true;
    job->run_chunks();
    t_inside_parallel = false;
  }
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace splice::cpu
