# A workflow helper that reads a host file and starts a thread: both outside `strict`.
import threading

with open("/etc/os-release") as f:
    name = f.readline().strip()
t = threading.Thread(target=print, args=("thread ran",))
t.start()
t.join()
print("read", name.split("=")[0])
