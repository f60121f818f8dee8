// Tests of the per-device property cache (api/device.hpp): each device ordinal is read once, a failed read is
// not kept, kept entries stay where they are while others are added, concurrent first calls on one device
// read it once; and current_device_info() describes the current device as the runtime does, or gives the
// device check's reason when there is none. Runs without a GPU (the reader is a fake); the last test uses
// whatever device the machine has.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "api/device.hpp"
#include "dash/attention.hpp"

namespace dash {
namespace {

// A reader that describes device d as having 100 + d SMs, and counts its reads per device.
class CountingReader {
 public:
  Status operator()(int device, DeviceInfo* info) {
    {
      std::lock_guard lock(mutex_);
      ++reads_[device];
    }
    info->index = device;
    info->multiprocessor_count = 100 + device;
    info->compute_major = 9;
    info->name = "device " + std::to_string(device);
    return Status::success();
  }
  int reads(int device) {
    std::lock_guard lock(mutex_);
    return reads_[device];
  }

 private:
  std::mutex mutex_;
  std::map<int, int> reads_;
};

TEST(DeviceInfoCache, ReadsEachDeviceOnce) {
  CountingReader reader;
  DeviceInfoCache cache([&](int device, DeviceInfo* info) { return reader(device, info); });
  const DeviceInfo* first = nullptr;
  const DeviceInfo* again = nullptr;
  const DeviceInfo* other = nullptr;
  ASSERT_TRUE(cache.find_or_read(0, &first).ok());
  ASSERT_TRUE(cache.find_or_read(0, &again).ok());
  ASSERT_TRUE(cache.find_or_read(1, &other).ok());
  EXPECT_EQ(first, again);
  EXPECT_EQ(first->multiprocessor_count, 100);
  EXPECT_EQ(first->name, "device 0");
  EXPECT_EQ(other->multiprocessor_count, 101);
  EXPECT_EQ(reader.reads(0), 1);
  EXPECT_EQ(reader.reads(1), 1);
}

TEST(DeviceInfoCache, KeepsNothingFromAFailedRead) {
  int reads = 0;
  DeviceInfoCache cache([&](int device, DeviceInfo* info) {
    if (++reads == 1) return Status(StatusCode::kNoDevice, "no CUDA device is visible");
    info->index = device;
    info->multiprocessor_count = 132;
    return Status::success();
  });
  const DeviceInfo* info = nullptr;
  const Status failed = cache.find_or_read(0, &info);
  EXPECT_EQ(failed.code(), StatusCode::kNoDevice);
  EXPECT_EQ(failed.message(), "no CUDA device is visible");
  EXPECT_EQ(info, nullptr);
  ASSERT_TRUE(cache.find_or_read(0, &info).ok());
  EXPECT_EQ(info->multiprocessor_count, 132);
  ASSERT_TRUE(cache.find_or_read(0, &info).ok());
  EXPECT_EQ(reads, 2);
}

TEST(DeviceInfoCache, KeptEntriesStayPutWhileOthersAreAdded) {
  CountingReader reader;
  DeviceInfoCache cache([&](int device, DeviceInfo* info) { return reader(device, info); });
  const DeviceInfo* first = nullptr;
  ASSERT_TRUE(cache.find_or_read(0, &first).ok());
  constexpr int kDevices = 1000;  // enough to rehash the map several times
  for (int device = 1; device < kDevices; ++device) {
    const DeviceInfo* info = nullptr;
    ASSERT_TRUE(cache.find_or_read(device, &info).ok());
  }
  const DeviceInfo* again = nullptr;
  ASSERT_TRUE(cache.find_or_read(0, &again).ok());
  EXPECT_EQ(again, first);
  EXPECT_EQ(first->name, "device 0");
  EXPECT_EQ(reader.reads(0), 1);
}

TEST(DeviceInfoCache, ConcurrentFirstCallsReadEachDeviceOnce) {
  constexpr int kThreads = 8;
  constexpr int kDevices = 4;
  constexpr int kLookups = 2000;
  CountingReader reader;
  DeviceInfoCache cache([&](int device, DeviceInfo* info) { return reader(device, info); });
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kLookups; ++k) {
        const int device = (t + k) % kDevices;
        const DeviceInfo* info = nullptr;
        if (!cache.find_or_read(device, &info).ok() || info->multiprocessor_count != 100 + device) ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
  for (int device = 0; device < kDevices; ++device) EXPECT_EQ(reader.reads(device), 1) << device;
}

TEST(CurrentDeviceInfo, RefusesANullOutput) {
  const Status status = current_device_info(nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "current_device_info: info must not be null");
}

// Without a device: the device check's kNoDevice status, *info untouched. With one: what the runtime reports,
// whatever its compute capability, the same at every call.
TEST(CurrentDeviceInfo, DescribesTheCurrentDeviceOrSaysWhyThereIsNone) {
  DeviceInfo info;
  info.multiprocessor_count = -1;
  const Status status = current_device_info(&info);
  const Status check = check_current_device();
  if (check.code() == StatusCode::kNoDevice) {
    EXPECT_EQ(status.to_string(), check.to_string());
    EXPECT_EQ(info.multiprocessor_count, -1);
    return;
  }
  ASSERT_TRUE(status.ok()) << status.to_string();
  int index = -1;
  ASSERT_EQ(cudaGetDevice(&index), cudaSuccess);
  cudaDeviceProp properties{};
  ASSERT_EQ(cudaGetDeviceProperties(&properties, index), cudaSuccess);
  EXPECT_EQ(info.index, index);
  EXPECT_EQ(info.multiprocessor_count, properties.multiProcessorCount);
  EXPECT_EQ(info.compute_major, properties.major);
  EXPECT_EQ(info.compute_minor, properties.minor);
  EXPECT_EQ(info.name, properties.name);
  DeviceInfo again;
  ASSERT_TRUE(current_device_info(&again).ok());
  EXPECT_EQ(again.multiprocessor_count, info.multiprocessor_count);
  EXPECT_EQ(again.name, info.name);
}

}  // namespace
}  // namespace dash
