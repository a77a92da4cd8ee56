// TEMPORARY scaffold: polykvd entry point, replaced by the daemon's owner.
int main() { return 1; }
