// The threads that run a decode step without barriers (tolerant.h): threads of the kernel's own, not an
// OpenMP team, doing the step while the caller's thread sleeps.
//
// When another process keeps a core busy, a team with the caller's thread in it cannot end a step (nor
// begin the next) while the scheduler holds the caller back, and the caller gets only its share of the
// cores. Asleep during the step, the caller is given a core as soon as the step is done (a thread that
// slept is owed its share), and the workers, never asleep while steps follow one another, get theirs:
// beside a busy process the steps had 1.3 cores instead of 1. A worker that ran the last step waits for
// the next spinning, and yields its core every kYieldNs (the caller samples between steps), so that it
// stays runnable; it sleeps after kIdleNs without a step, and at once where the last step did not need it.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Pool {
 public:
  static constexpr int64_t kIdleNs = 5'000'000;  // a worker sleeps after this long without a step
  static constexpr int64_t kYieldNs = 20'000;    // a waiting worker yields its core this often

  // body(t) for t in 0..n, each on a worker of its own; returns once every one has returned (asleep meanwhile)
  void run(int n, const std::function<void(int)>& body) {
    std::lock_guard<std::mutex> one_at_a_time(run_mutex_);
    grow(n);
    body_ = &body;
    left_.store(0, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const uint64_t number = (job_.load(std::memory_order_relaxed) >> 16) + 1;
      job_.store(number << 16 | static_cast<uint64_t>(n), std::memory_order_release);
      if (sleepers_ > 0) work_.notify_all();
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return left_.load(std::memory_order_acquire) == n; });
    if (failed_.exchange(false)) throw std::runtime_error("a worker failed");  // (a failed allocation)
  }

 private:
  void grow(int n) {
    while (workers_ < n) {
      std::thread([this, w = workers_] { loop(w); }).detach();
      workers_++;
    }
  }

  // until a job other than `seen`, asleep
  void sleep(uint64_t seen) {
    std::unique_lock<std::mutex> lock(mutex_);
    sleepers_++;
    work_.wait(lock, [&] { return job_.load(std::memory_order_acquire) != seen; });
    sleepers_--;
  }

  // until a job other than `seen`, spinning (yielding now and then) for kIdleNs, then asleep
  void spin(uint64_t seen) {
    const int64_t start = now_ns();
    int64_t yielded = start;
    for (int spin = 1; job_.load(std::memory_order_acquire) == seen; spin++) {
      relax();
      if (spin % 64 != 0) continue;
      const int64_t now = now_ns();
      if (now - start > kIdleNs) return sleep(seen);
      if (now - yielded > kYieldNs) {
        sched_yield();
        yielded = now;
      }
    }
  }

  void loop(int w) {
    uint64_t seen = 0;
    bool needed = false;  // whether the last job ran on this worker
    for (;;) {
      if (needed)
        spin(seen);
      else
        sleep(seen);
      seen = job_.load(std::memory_order_acquire);  // its number and width together: a worker of it
      const int n = static_cast<int>(seen & 0xFFFF);  // cannot miss it, nor take the next one for it
      needed = w < n;
      if (!needed) continue;
      try {  // no exception may end the thread (the others do its items; the call then fails)
        (*body_)(w);
      } catch (...) {
        failed_.store(true);
      }
      if (left_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
        std::lock_guard<std::mutex> lock(mutex_);
        done_.notify_one();
      }
    }
  }

  std::mutex run_mutex_;  // one step at a time (callers on several threads wait their turn)
  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::atomic<uint64_t> job_{0};  // the job's number << 16 | its width
  std::atomic<int> left_{0};       // the job's threads that have returned
  std::atomic<bool> failed_{false};  // one of them threw
  int sleepers_ = 0;               // workers asleep (under mutex_)
  const std::function<void(int)>* body_ = nullptr;
  int workers_ = 0;
};

// the process's pool (created at the first step; its threads outlive it, asleep, to the process's end;
// a child made by fork() gets a pool of its own, without the parent's threads)
inline Pool& pool() {
  static Pool* shared = nullptr;
  static pid_t owner = 0;
  static std::mutex guard;
  std::lock_guard<std::mutex> lock(guard);
  if (shared == nullptr || owner != getpid()) {
    shared = new Pool();  // never deleted: detached threads may still read it at exit
    owner = getpid();
  }
  return *shared;
}

}  // namespace
